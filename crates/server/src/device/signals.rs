//! [`SignalArea`]: completion counters that a device writes in stream order and the
//! server reads without a round trip — how the scheduling gate sees queued work finish.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cumux_protocol::{codes, CuError, Handle};
use memmap2::MmapMut;

use crate::locking::lock;

/// Counters per area: one per stream a session may hold, and the default stream, with
/// room; the last is [`ERROR_SLOT`].
pub const SIGNAL_SLOTS: u32 = 1024;
/// The counter the worker raises each time queued work fails to start there (a
/// launch the driver refuses): the server, which otherwise answers a synchronize
/// from the counters alone, then asks the worker, which returns the failure.
pub const ERROR_SLOT: u32 = SIGNAL_SLOTS - 1;
const AREA_BYTES: usize = SIGNAL_SLOTS as usize * 8;

/// A small shared file of `u64` counters, one per slot. The server creates it and
/// reads it; the worker serving the session's context opens it by path, and its
/// streams store a counter's new value once the work queued before it is done
/// ([`super::StreamWork::Signal`]). Values only grow, so a reader waiting for value
/// `v` is done once the slot holds `v` or more.
pub struct SignalArea {
    map: MmapMut,
    /// Until [`unlink`](Self::unlink): the file's name, for the worker to open.
    path: Mutex<Option<PathBuf>>,
    /// Run once when the area goes away (the GPU context unregisters the mapping).
    on_drop: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// The device's address of slot 0, once a GPU context registered the mapping.
    device_base: std::sync::OnceLock<u64>,
}

impl std::fmt::Debug for SignalArea {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SignalArea({:p})", self.map.as_ptr())
    }
}

impl PartialEq for SignalArea {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> CuError {
    CuError::new(
        codes::UNKNOWN,
        format!("signal area {}: {what}: {e}", path.display()),
    )
}

fn map(file: &File, path: &Path) -> Result<MmapMut, CuError> {
    let len = file
        .metadata()
        .map_err(|e| io_error("stat", path, e))?
        .len();
    if len != AREA_BYTES as u64 {
        return Err(CuError::new(
            codes::INVALID_VALUE,
            format!("signal area {} has {len} bytes", path.display()),
        ));
    }
    // SAFETY: the file has exactly AREA_BYTES bytes (checked above) and nobody
    // truncates it: it is private to this server and its worker (mode 0600, unlinked
    // once the worker has it). Its contents are only ever read and written through
    // atomics.
    unsafe { MmapMut::map_mut(file) }.map_err(|e| io_error("mmap", path, e))
}

impl SignalArea {
    /// A fresh area of zeroed counters in a private file (in `/dev/shm` when there is one).
    pub fn create() -> Result<Self, CuError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = Path::new("/dev/shm");
        let dir = if dir.is_dir() {
            dir.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = dir.join(format!(
            "cumux-signals-{}-{}-{nanos:08x}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io_error("create", &path, e))?;
        let sized = file.set_len(AREA_BYTES as u64);
        let mapped = sized
            .map_err(|e| io_error("size", &path, e))
            .and_then(|()| map(&file, &path));
        match mapped {
            Ok(map) => Ok(SignalArea {
                map,
                path: Mutex::new(Some(path)),
                on_drop: Mutex::new(None),
                device_base: std::sync::OnceLock::new(),
            }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }

    /// The area the server created at `path` (in the worker).
    pub fn open(path: &Path) -> Result<Self, CuError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| io_error("open", path, e))?;
        Ok(SignalArea {
            map: map(&file, path)?,
            path: Mutex::new(None),
            on_drop: Mutex::new(None),
            device_base: std::sync::OnceLock::new(),
        })
    }

    /// The file's name, until [`unlink`](Self::unlink).
    pub fn path(&self) -> Option<PathBuf> {
        lock(&self.path).clone()
    }

    /// Removes the file's name (the mappings stay): once the worker has opened it.
    pub fn unlink(&self) {
        if let Some(path) = lock(&self.path).take() {
            let _ = std::fs::remove_file(path);
        }
    }

    fn slot(&self, slot: u32) -> Option<&AtomicU64> {
        if slot >= SIGNAL_SLOTS {
            return None;
        }
        // SAFETY: the mapping is page-aligned and AREA_BYTES long, so slot `slot`
        // (< SIGNAL_SLOTS) is an aligned, in-bounds u64, and it lives as long as
        // `self`. AtomicU64 has u64's layout; the other process only uses atomic
        // accesses (or the device's 8-byte writes) on it.
        Some(unsafe { &*self.map.as_ptr().cast::<AtomicU64>().add(slot as usize) })
    }

    /// The counter of `slot` (0 out of range).
    pub fn load(&self, slot: u32) -> u64 {
        self.slot(slot).map_or(0, |s| s.load(Ordering::Acquire))
    }

    /// Counts one more failure in [`ERROR_SLOT`].
    pub fn raise_error(&self) {
        if let Some(s) = self.slot(ERROR_SLOT) {
            s.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Raises the counter of `slot` to `value`; false out of range.
    pub fn store(&self, slot: u32, value: u64) -> bool {
        match self.slot(slot) {
            Some(s) => {
                s.fetch_max(value, Ordering::Release);
                true
            }
            None => false,
        }
    }

    /// The mapping's address and length, for a device that registers it.
    pub fn host_range(&self) -> (usize, usize) {
        (self.map.as_ptr() as usize, AREA_BYTES)
    }

    /// The device address of `slot` (after [`set_device_base`](Self::set_device_base)).
    pub fn device_addr(&self, slot: u32) -> Option<u64> {
        let base = *self.device_base.get()?;
        (slot < SIGNAL_SLOTS).then(|| base + 8 * u64::from(slot))
    }

    /// Records where a device sees the mapping (the first call wins).
    pub fn set_device_base(&self, base: u64) {
        let _ = self.device_base.set(base);
    }

    /// Runs `hook` when the area goes away (once; a second hook replaces the first).
    pub fn on_drop(&self, hook: Box<dyn FnOnce() + Send>) {
        *lock(&self.on_drop) = Some(hook);
    }
}

/// A session's use of its area: a slot per stream that has launched, each launch's
/// value (the stream's launch count), and how far each slot's signals have gone.
/// A signal covers every launch of its stream before it, so a stream need not be
/// signalled after every launch: the session signals every few launches, and
/// [`flush`](Self::flush)es the rest before anything waits. A destroyed stream's
/// slot goes to the next new stream, its values carrying on from where they were,
/// so a late signal of the old stream can never look like one of the new.
pub struct StreamSignals {
    area: Arc<SignalArea>,
    slots: HashMap<Handle, u32>,
    /// Per slot: the latest launch's value, and the latest value signalled.
    values: Vec<(u64, u64)>,
    free: Vec<u32>,
    /// Streams with work other than launches queued since their last signal
    /// (or with no signal at all): their counters do not say when they are idle.
    unsignalled: std::collections::HashSet<Handle>,
}

impl StreamSignals {
    pub fn new(area: Arc<SignalArea>) -> Self {
        StreamSignals {
            area,
            slots: HashMap::new(),
            values: Vec::new(),
            free: Vec::new(),
            unsignalled: std::collections::HashSet::new(),
        }
    }

    pub fn area(&self) -> &Arc<SignalArea> {
        &self.area
    }

    /// A new launch on `stream`: its slot and value (done once the slot reaches
    /// it); `None` when every slot is taken.
    pub fn launch(&mut self, stream: Handle) -> Option<(u32, u64)> {
        let slot = match self.slots.get(&stream) {
            Some(&slot) => slot,
            None => {
                let slot = match self.free.pop() {
                    Some(slot) => slot,
                    None if self.values.len() < ERROR_SLOT as usize => {
                        self.values.push((0, 0));
                        (self.values.len() - 1) as u32
                    }
                    None => return None,
                };
                self.slots.insert(stream, slot);
                slot
            }
        };
        let (latest, _) = &mut self.values[slot as usize];
        *latest += 1;
        Some((slot, *latest))
    }

    /// The signal that covers `stream`'s launches so far, if `every` or more of
    /// them are not covered yet (marking them covered).
    pub fn due(&mut self, stream: Handle, every: u64) -> Option<(u32, u64)> {
        let slot = *self.slots.get(&stream)?;
        let (latest, signalled) = &mut self.values[slot as usize];
        if *latest - *signalled < every.max(1) {
            return None;
        }
        *signalled = *latest;
        self.unsignalled.remove(&stream);
        Some((slot, *latest))
    }

    /// Work other than a launch was queued on `stream` (or a launch without a signal).
    pub fn note_work(&mut self, stream: Handle) {
        self.unsignalled.insert(stream);
    }

    /// When every launch of `stream` is covered by a signal queued after all its
    /// other work: the (slot, value) that says it is idle.
    pub fn settled(&self, stream: Handle) -> Option<(u32, u64)> {
        let slot = *self.slots.get(&stream)?;
        let (latest, signalled) = self.values[slot as usize];
        (latest == signalled && !self.unsignalled.contains(&stream)).then_some((slot, latest))
    }

    /// The (slot, value) of every stream that has launched, when all of the
    /// session's streams are [`settled`](Self::settled); `None` otherwise.
    pub fn all_settled(&self) -> Option<Vec<(u32, u64)>> {
        if !self.unsignalled.is_empty() {
            return None;
        }
        self.slots
            .keys()
            .map(|&stream| self.settled(stream))
            .collect()
    }

    /// Every stream's signal for the launches not covered yet (marking them covered).
    pub fn flush(&mut self) -> Vec<(Handle, u32, u64)> {
        let mut due = Vec::new();
        for (&stream, &slot) in &self.slots {
            let (latest, signalled) = &mut self.values[slot as usize];
            if latest > signalled {
                *signalled = *latest;
                due.push((stream, slot, *latest));
            }
        }
        for (stream, _, _) in &due {
            self.unsignalled.remove(stream);
        }
        due
    }

    /// `stream` is gone (after its last signal was queued): its slot may serve another.
    pub fn release(&mut self, stream: Handle) {
        self.unsignalled.remove(&stream);
        if let Some(slot) = self.slots.remove(&stream) {
            self.free.push(slot);
        }
    }
}

impl Drop for SignalArea {
    fn drop(&mut self) {
        if let Some(hook) = self
            .on_drop
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            hook();
        }
        self.unlink();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_sees_the_servers_counters_and_the_server_sees_its_writes() {
        let server = SignalArea::create().unwrap();
        let path = server.path().unwrap();
        let worker = SignalArea::open(&path).unwrap();
        server.unlink();
        assert!(!path.exists());
        assert!(worker.store(7, 42));
        assert_eq!(server.load(7), 42);
        // Counters only grow: a late, smaller value changes nothing.
        assert!(worker.store(7, 41));
        assert_eq!(server.load(7), 42);
        assert!(!worker.store(SIGNAL_SLOTS, 1));
        assert_eq!(server.load(SIGNAL_SLOTS), 0);
    }

    #[test]
    fn a_file_of_the_wrong_size_is_refused() {
        let path = std::env::temp_dir().join(format!("cumux-signals-bad-{}", std::process::id()));
        std::fs::write(&path, [0u8; 100]).unwrap();
        let e = SignalArea::open(&path).unwrap_err();
        assert_eq!(e.code, codes::INVALID_VALUE);
        std::fs::remove_file(&path).unwrap();
        assert!(SignalArea::open(&path).is_err());
    }

    #[test]
    fn a_reused_slot_keeps_counting_up() {
        let mut signals = StreamSignals::new(Arc::new(SignalArea::create().unwrap()));
        assert_eq!(signals.launch(5), Some((0, 1)));
        assert_eq!(signals.launch(5), Some((0, 2)));
        assert_eq!(signals.launch(9), Some((1, 1)));
        signals.release(5);
        assert_eq!(signals.launch(11), Some((0, 3)));
        for stream in 100..100 + u64::from(ERROR_SLOT) - 2 {
            assert!(signals.launch(stream).is_some());
        }
        assert_eq!(signals.launch(1), None);
    }

    #[test]
    fn signals_cover_every_few_launches_and_a_flush_covers_the_rest() {
        let mut signals = StreamSignals::new(Arc::new(SignalArea::create().unwrap()));
        for _ in 0..3 {
            signals.launch(7);
        }
        signals.launch(8);
        assert_eq!(signals.due(7, 4), None);
        signals.launch(7);
        assert_eq!(signals.due(7, 4), Some((0, 4)));
        assert_eq!(signals.due(7, 4), None);
        signals.launch(7);
        let mut flushed = signals.flush();
        flushed.sort();
        assert_eq!(flushed, vec![(7, 0, 5), (8, 1, 1)]);
        assert!(signals.flush().is_empty());
        assert_eq!(signals.due(8, 1), None);
    }

    #[test]
    fn the_drop_hook_runs_once() {
        let ran = std::sync::Arc::new(AtomicU64::new(0));
        let area = SignalArea::create().unwrap();
        let path = area.path().unwrap();
        let counter = std::sync::Arc::clone(&ran);
        area.on_drop(Box::new(move || {
            counter.fetch_add(1, Ordering::Relaxed);
        }));
        drop(area);
        assert_eq!(ran.load(Ordering::Relaxed), 1);
        assert!(!path.exists());
    }

    #[test]
    fn a_stream_is_settled_once_a_signal_follows_all_its_work() {
        let mut signals = StreamSignals::new(Arc::new(SignalArea::create().unwrap()));
        assert_eq!(signals.settled(1), None, "no launch yet");
        signals.launch(1);
        assert_eq!(signals.settled(1), None, "a launch not covered");
        assert_eq!(signals.due(1, 1), Some((0, 1)));
        assert_eq!(signals.settled(1), Some((0, 1)));
        signals.note_work(1);
        assert_eq!(signals.settled(1), None, "a copy after the signal");
        signals.launch(1);
        assert_eq!(signals.flush(), vec![(1, 0, 2)]);
        assert_eq!(signals.settled(1), Some((0, 2)));
        assert_eq!(signals.all_settled(), Some(vec![(0, 2)]));
        signals.note_work(2);
        assert_eq!(signals.all_settled(), None, "stream 2 has unsignalled work");
        assert_eq!(signals.settled(1), Some((0, 2)));
        signals.release(2);
        assert_eq!(signals.all_settled(), Some(vec![(0, 2)]));
    }

    #[test]
    fn the_error_slot_is_never_a_streams() {
        let area = Arc::new(SignalArea::create().unwrap());
        let mut signals = StreamSignals::new(Arc::clone(&area));
        for stream in 0..u64::from(SIGNAL_SLOTS) {
            if let Some((slot, _)) = signals.launch(stream) {
                assert_ne!(slot, ERROR_SLOT);
            }
        }
        area.raise_error();
        area.raise_error();
        assert_eq!(area.load(ERROR_SLOT), 2);
    }
}
