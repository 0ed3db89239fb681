//! Marks: how the program sees an event it recorded reached without asking.
//! Each device's session gets one pinned page of 8-byte slots; an event takes a
//! slot, and once the program has waited on it, each record of it is followed
//! by a `Call::Mark` of the slot's next value, which the device stores once the
//! stream's work before it is done
//! (`server::session::streams::mark`). The server leaves a mark out whenever
//! the wait would have news (a failure, printf text), so a slot that reached
//! its value means exactly what a successful synchronize would; a slot that
//! did not within a short spin means the wait asks the server, as before.
//! A synchronize of a stream (or of the context, one mark per busy stream)
//! sends a mark without an event, stored in the stream's own order: a slot
//! per stream.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cumux_cuda_bindings::consts::CU_EVENT_INTERPROCESS;
use cumux_protocol::hop_trace::{self, Hop};
use cumux_protocol::{Call, Handle};

use crate::errors::CuResult;
use crate::state::{Client, PinnedMemory};

/// Slots of a device's page of marks (8 bytes each, one page).
const SLOTS: u32 = 512;
/// `CUMUX_MARKS=off` leaves every wait to the server (for comparisons).
pub const ENV: &str = "CUMUX_MARKS";
/// How long a wait watches its mark before it asks the server: about what a
/// round trip takes to be worth sparing; longer waits gain nothing from it.
const WATCH: Duration = Duration::from_micros(200);

/// How long a watch spins before it yields its core between looks: as long
/// as the connection spins for an answer (`CUMUX_SHM_SPIN_US`, else all of
/// [`WATCH`] on hosts of 8 or more cores, 50 µs on smaller ones), so that a
/// mark is seen as soon as an answer would be. Read once.
fn spin() -> Duration {
    static SPIN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| cumux_protocol::shm::answer_spin_from_env().min(WATCH))
}

/// A device's page of marks: its slots, free and taken, and each slot's last
/// value (values only grow, so a slot given to a new event never looks
/// reached by an old event's store).
pub struct Marks {
    memory: Arc<PinnedMemory>,
    free: Vec<u32>,
    values: Vec<u64>,
    /// The slot of each stream that was synchronized through a mark.
    streams: HashMap<Handle, u32>,
}

/// An event's slot, the value its latest record's mark stores (`None`: the
/// latest record has no mark), and whether the program ever waited on it or
/// asked about it: only then do its records get marks, so an event that only
/// orders streams or times work costs the device nothing more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventMark {
    pub slot: u32,
    pub target: Option<u64>,
    pub waited: bool,
}

impl EventMark {
    /// A fresh event's slot.
    pub fn new(slot: u32) -> Self {
        EventMark {
            slot,
            target: None,
            waited: false,
        }
    }
}

impl Marks {
    fn new(memory: PinnedMemory) -> Self {
        Marks {
            memory: Arc::new(memory),
            free: (0..SLOTS).rev().collect(),
            values: vec![0; SLOTS as usize],
            streams: HashMap::new(),
        }
    }
}

/// What a wait watches: the page, the slot and the value that says "reached".
pub struct Watch {
    memory: Arc<PinnedMemory>,
    slot: u32,
    target: u64,
}

impl Watch {
    fn cell(&self) -> &AtomicU64 {
        let base = self.memory.ptr().cast::<u64>();
        // SAFETY: `slot` < SLOTS and the page holds SLOTS aligned u64s; the
        // mapping lives as long as `memory`. The device (or the worker)
        // stores into it; this process only loads, atomically.
        unsafe { AtomicU64::from_ptr(base.add(self.slot as usize)) }
    }

    /// Whether the mark is there now.
    pub fn reached(&self) -> bool {
        self.cell().load(Ordering::Acquire) >= self.target
    }

    /// Watches the mark for up to [`WATCH`]: whether it came.
    pub fn wait(&self) -> bool {
        wait_all(std::slice::from_ref(self))
    }
}

/// Watches every mark of `watches` for up to [`WATCH`] in all: whether they
/// all came.
fn wait_all(watches: &[Watch]) -> bool {
    let started = Instant::now();
    let spin = spin();
    let mut left = watches;
    loop {
        while let Some((first, rest)) = left.split_first() {
            if !first.reached() {
                break;
            }
            left = rest;
        }
        if left.is_empty() {
            return true;
        }
        let waited = started.elapsed();
        if waited >= WATCH {
            return false;
        }
        match waited < spin {
            // As the connection's own spin: a hyperthread beside it (the
            // server's, the worker's) keeps most of its core.
            true => cumux_protocol::shm::pause_between_looks(),
            false => std::thread::yield_now(),
        }
    }
}

fn enabled() -> bool {
    std::env::var(ENV).map_or(true, |v| !matches!(v.trim(), "off" | "0"))
}

/// A slot for a new event of `device`; `None` when the device's session has
/// no page of marks (yet: [`after_wait`] makes it; or a link without pinned
/// memory) or every slot is taken. A resumable program gets none: a session
/// that shares pinned memory with its server cannot move to another.
pub fn take_slot(c: &Client, device: u32) -> Option<u32> {
    c.lock().marks.get_mut(&device)?.as_mut()?.free.pop()
}

/// Whether `device`'s session has its page of marks now (a synchronize
/// never makes it: see [`after_wait`]).
pub fn ready(c: &Client, device: u32) -> bool {
    c.lock().marks.get(&device).is_some_and(Option::is_some)
}

/// After a synchronize the server answered: makes `device`'s page of marks
/// (one round trip, once) if marks are on and it has none yet, so that
/// later synchronizes use marks. Made here rather than at the wait that
/// needs it: the device has just finished the work waited for, and a device
/// that runs work in one order (the CPU device in a worker) takes the
/// registration only after the work queued before it, so one made while a
/// kernel never ends would hang the wait instead of failing it.
pub fn after_wait(c: &Client, device: u32) {
    if c.lock().marks.contains_key(&device) {
        return;
    }
    if !enabled() || crate::resume::wanted() {
        // Asked once: the device has no marks.
        c.lock().marks.entry(device).or_insert(None);
        return;
    }
    let memory = crate::pinned::alloc_on(c, device, 8 * SLOTS as usize);
    let mut st = c.lock();
    match st.marks.contains_key(&device) {
        // Another thread made the device's page meanwhile: this one goes back.
        true => {
            drop(st);
            if let Some(memory) = memory {
                crate::pinned::free(c, memory);
            }
        }
        false => {
            st.marks.insert(device, memory.map(Marks::new));
        }
    }
}

/// Gives an event's slot back.
pub fn release(c: &Client, device: u32, slot: u32) {
    if let Some(Some(marks)) = c.lock().marks.get_mut(&device) {
        marks.free.push(slot);
    }
}

/// Gives a destroyed stream's slot back, if it had one.
pub fn release_stream(c: &Client, device: u32, stream: Handle) {
    if let Some(Some(marks)) = c.lock().marks.get_mut(&device) {
        if let Some(slot) = marks.streams.remove(&stream) {
            marks.free.push(slot);
        }
    }
}

/// Streams one synchronize marks at most: a context with more busy streams
/// is asked, as before.
const MOST_STREAMS: usize = 8;

/// Waits for the work queued so far on `streams` of `device` through marks
/// stored in each stream's own order (`Call::Mark` without an event), for
/// up to [`WATCH`]: whether every mark came, so that the synchronize is done
/// (the link then knows those streams idle). `false`: no marks here (none
/// for this device, too many streams, no slot left) or one did not come;
/// the caller asks the server, as before.
pub fn sync_streams(c: &Client, device: u32, streams: &[Handle]) -> CuResult<bool> {
    if streams.is_empty() || streams.len() > MOST_STREAMS || !ready(c, device) {
        return Ok(false);
    }
    let link = c.link(device, "Mark")?;
    let mut sent = Vec::with_capacity(streams.len());
    let mut watches = Vec::with_capacity(streams.len());
    // A slot's marks are sent in the order of their values, so that its
    // stores only grow in its stream's order: a wait that sees a later
    // value than its own knows its own work done.
    static SENDING: Mutex<()> = Mutex::new(());
    let order = SENDING.lock().unwrap_or_else(|p| p.into_inner());
    for &stream in streams {
        let Some((call, watch)) = stream_mark(c, device, stream) else {
            break;
        };
        match link.send_mark(call) {
            Ok(seq) => sent.push(seq),
            Err(e) => {
                sent.iter().for_each(|seq| link.mark_seen(*seq, false));
                return Err(e);
            }
        }
        watches.push(watch);
    }
    drop(order);
    let reached = watches.len() == streams.len() && wait_all(&watches);
    if reached {
        hop_trace::mark(Hop::Step, "mark-seen");
    }
    sent.iter().for_each(|seq| link.mark_seen(*seq, reached));
    Ok(reached)
}

/// The mark of `stream`'s work so far, with what will say it was reached;
/// `None` when no slot is left for the stream.
fn stream_mark(c: &Client, device: u32, stream: Handle) -> Option<(Call, Watch)> {
    let mut st = c.lock();
    let marks = st.marks.get_mut(&device)?.as_mut()?;
    let slot = match marks.streams.get(&stream) {
        Some(slot) => *slot,
        None => {
            let slot = marks.free.pop()?;
            marks.streams.insert(stream, slot);
            slot
        }
    };
    let value = &mut marks.values[slot as usize];
    *value += 1;
    let call = Call::Mark {
        event: None,
        stream,
        region: marks.memory.region,
        offset: 8 * u64::from(slot),
        value: *value,
    };
    let watch = Watch {
        memory: Arc::clone(&marks.memory),
        slot,
        target: *value,
    };
    Some((call, watch))
}

/// Sends `call`; after a record of an event with a slot, its mark too. Every
/// record of a program's event goes through here (a graph's replay too), so
/// an event's target is never that of an older record.
pub fn send_marked(c: &Client, call: Call) -> CuResult<()> {
    let recorded = match call {
        Call::EventRecord { event, stream } => Some((event, stream)),
        _ => None,
    };
    c.call(call)?;
    match recorded {
        Some((event, stream)) => after_record(c, event, stream),
        None => Ok(()),
    }
}

/// After `event` (with its slot) was recorded on `stream`: asks for its mark,
/// and notes the value that will say it was reached.
fn after_record(c: &Client, event: Handle, stream: Handle) -> CuResult<()> {
    let device = cumux_protocol::device_of_handle(event);
    let (call, slot, value) = {
        let mut st = c.lock();
        let Some(mark) = st.events.get_mut(&event).and_then(|e| e.mark.as_mut()) else {
            return Ok(());
        };
        // Unset until this record's mark is on its way: a record without
        // one is asked about.
        mark.target = None;
        if !mark.waited {
            return Ok(());
        }
        let slot = mark.slot;
        let Some(Some(marks)) = st.marks.get_mut(&device) else {
            return Ok(());
        };
        let value = &mut marks.values[slot as usize];
        *value += 1;
        let call = Call::Mark {
            event: Some(event),
            stream,
            region: marks.memory.region,
            offset: 8 * u64::from(slot),
            value: *value,
        };
        (call, slot, *value)
    };
    c.call_on(device, call)?;
    let mut st = c.lock();
    let mark = st.events.get_mut(&event).and_then(|e| e.mark.as_mut());
    if let Some(mark) = mark.filter(|m| m.slot == slot) {
        mark.target = Some(value);
    }
    Ok(())
}

/// What to watch to see `event`'s latest record reached, if it has a mark;
/// from now on its records get marks. An event made before its device had
/// its page of marks takes a slot here, once the page is there.
pub fn watch(c: &Client, event: Handle) -> Option<Watch> {
    let device = cumux_protocol::device_of_handle(event);
    let mut st = c.lock();
    let unmarked = st
        .events
        .get(&event)
        .is_some_and(|e| e.mark.is_none() && e.flags & CU_EVENT_INTERPROCESS == 0);
    if unmarked {
        let slot = st.marks.get_mut(&device)?.as_mut()?.free.pop()?;
        if let Some(e) = st.events.get_mut(&event) {
            e.mark = Some(EventMark::new(slot));
        }
    }
    let mark = st.events.get_mut(&event)?.mark.as_mut()?;
    mark.waited = true;
    let EventMark { slot, target, .. } = *mark;
    let marks = st.marks.get(&device)?.as_ref()?;
    Some(Watch {
        memory: Arc::clone(&marks.memory),
        slot,
        target: target?,
    })
}
