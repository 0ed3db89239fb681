//! NVIDIA's per-process utilization samples (`nvmlDeviceGetProcessUtilization`
//! of NVIDIA's NVML, loaded at run time), turned into a set of processes' share of a GPU.

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CString, OsStr};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use cumux_protocol::nvml_search::{self, CUMUX_NVML_MARKER};
use libloading::Library;

use crate::locking::lock;
use crate::utilization::{SAMPLE_EVERY, WINDOW};

/// How long samples are kept (those of the last window, and enough before
/// it to tell the driver's sampling period).
const HISTORY: Duration = Duration::from_secs(3);
/// The most samples one query takes.
const MAX_SAMPLES: usize = 4096;

const NVML_SUCCESS: c_int = 0;
const NVML_ERROR_NOT_FOUND: c_int = 6;
const NVML_ERROR_INSUFFICIENT_SIZE: c_int = 7;

/// `nvmlProcessUtilizationSample_t`, as NVIDIA's header lays it out.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct RawSample {
    pid: c_uint,
    time_stamp: c_ulonglong,
    sm_util: c_uint,
    mem_util: c_uint,
    enc_util: c_uint,
    dec_util: c_uint,
}

type InitFn = unsafe extern "C" fn() -> c_int;
type HandleByUuidFn = unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> c_int;
type ProcessUtilizationFn =
    unsafe extern "C" fn(*mut c_void, *mut RawSample, *mut c_uint, c_ulonglong) -> c_int;

/// NVIDIA's NVML, loaded and started.
struct Nvml {
    handle_by_uuid: HandleByUuidFn,
    process_utilization: ProcessUtilizationFn,
    /// Kept loaded for as long as the functions above are called.
    _library: Library,
}

/// `path` loaded and started, if it is an NVML that is not cumux's.
fn open(path: &Path) -> Result<Nvml, String> {
    // SAFETY: loading runs the library's initialisers; it is the system's
    // NVML or the one the operator named.
    let library = unsafe { Library::new(OsStr::new(path)) }.map_err(|e| e.to_string())?;
    // SAFETY: only whether the symbol exists is asked.
    if unsafe { library.get::<*const c_void>(CUMUX_NVML_MARKER.as_bytes()) }.is_ok() {
        return Err("it is cumux's own NVML".into());
    }
    // SAFETY: each type is the one NVIDIA's nvml.h gives that name.
    let (init, handle_by_uuid, process_utilization) = unsafe {
        let init = *library
            .get::<InitFn>(b"nvmlInit_v2")
            .map_err(|e| e.to_string())?;
        let by_uuid = *library
            .get::<HandleByUuidFn>(b"nvmlDeviceGetHandleByUUID")
            .map_err(|e| e.to_string())?;
        let samples = *library
            .get::<ProcessUtilizationFn>(b"nvmlDeviceGetProcessUtilization")
            .map_err(|e| e.to_string())?;
        (init, by_uuid, samples)
    };
    // SAFETY: nvmlInit_v2 takes nothing; NVML counts its starts.
    let rc = unsafe { init() };
    if rc != NVML_SUCCESS {
        return Err(format!("nvmlInit_v2 answered {rc}"));
    }
    Ok(Nvml {
        handle_by_uuid,
        process_utilization,
        _library: library,
    })
}

/// The places to look, in order: cumux's NVML's own list (the named
/// library alone where `$CUMUX_REAL_NVML` is set, else those that exist),
/// then the loader's search by name.
fn candidates() -> Vec<PathBuf> {
    if nvml_search::named().is_some() {
        return nvml_search::candidates();
    }
    nvml_search::candidates()
        .into_iter()
        .filter(|p| p.exists())
        .chain(std::iter::once(PathBuf::from(nvml_search::SONAME)))
        .collect()
}

impl Nvml {
    /// The first NVIDIA NVML of `paths` that loads and starts.
    fn find(paths: &[PathBuf]) -> Option<Nvml> {
        let mut refusals = Vec::new();
        for path in paths {
            match open(path) {
                Ok(nvml) => return Some(nvml),
                Err(why) => refusals.push(format!("{}: {why}", path.display())),
            }
        }
        tracing::debug!(
            "no NVIDIA NVML ({}): a GPU under fifo shared by tenants has no per-tenant utilization",
            refusals.join("; ")
        );
        None
    }

    /// NVML's handle of the GPU whose UUID is `uuid`.
    fn device(&self, uuid: &[u8; 16]) -> Option<usize> {
        let text = CString::new(cumux_protocol::visible_devices::uuid_text(uuid)).ok()?;
        let mut handle: *mut c_void = std::ptr::null_mut();
        // SAFETY: a NUL-terminated UUID and a place for the handle, as the
        // function's contract asks.
        let rc = unsafe { (self.handle_by_uuid)(text.as_ptr(), &mut handle) };
        (rc == NVML_SUCCESS && !handle.is_null()).then_some(handle as usize)
    }

    /// The device's samples newer than `since` (NVML's clock, µs).
    fn samples(&self, device: usize, since: u64) -> Result<Vec<Sample>, c_int> {
        let device = device as *mut c_void;
        let mut count: c_uint = 0;
        // SAFETY: a null buffer asks only how many samples there are.
        let rc =
            unsafe { (self.process_utilization)(device, std::ptr::null_mut(), &mut count, since) };
        match rc {
            NVML_ERROR_NOT_FOUND => return Ok(Vec::new()),
            NVML_SUCCESS | NVML_ERROR_INSUFFICIENT_SIZE => {}
            other => return Err(other),
        }
        if count == 0 {
            return Ok(Vec::new());
        }
        // Room for processes that start between the two calls.
        let mut buf = vec![RawSample::default(); (count as usize + 8).min(MAX_SAMPLES)];
        let mut count = buf.len() as c_uint;
        // SAFETY: the buffer holds `count` samples.
        let rc = unsafe { (self.process_utilization)(device, buf.as_mut_ptr(), &mut count, since) };
        match rc {
            NVML_ERROR_NOT_FOUND => Ok(Vec::new()),
            NVML_SUCCESS => {
                buf.truncate(count as usize);
                Ok(buf.iter().map(Sample::from).collect())
            }
            other => Err(other),
        }
    }
}

/// One process's use of a GPU in one of the driver's sampling periods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub pid: u32,
    /// When the driver took it (NVML's clock, µs).
    pub at_us: u64,
    /// The share of the period in which the process ran kernels, in percent.
    pub sm: u32,
}

impl From<&RawSample> for Sample {
    fn from(raw: &RawSample) -> Self {
        Sample {
            pid: raw.pid,
            at_us: raw.time_stamp,
            sm: raw.sm_util.min(100),
        }
    }
}

/// One GPU's samples, each with when the server received it: the window is
/// kept by the server's clock, so NVML's clock may be any.
#[derive(Debug, Default)]
pub struct DeviceSamples {
    samples: VecDeque<(Instant, Sample)>,
    /// The newest sample's time: the next query asks for what came after.
    last_seen_us: u64,
}

impl DeviceSamples {
    /// Adds a query's answer, received at `now`. The first answer may hold
    /// the driver's whole buffer: only its last window is kept.
    pub fn add(&mut self, now: Instant, answer: Vec<Sample>) {
        let newest = answer.iter().map(|s| s.at_us).max().unwrap_or(0);
        let oldest_kept = if self.last_seen_us == 0 {
            newest.saturating_sub(WINDOW.as_micros() as u64) + 1
        } else {
            self.last_seen_us + 1
        };
        self.samples.extend(
            answer
                .into_iter()
                .filter(|s| s.at_us >= oldest_kept)
                .map(|s| (now, s)),
        );
        self.last_seen_us = self.last_seen_us.max(newest);
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > HISTORY)
        {
            self.samples.pop_front();
        }
    }

    /// The driver's sampling period: the median gap between one process's
    /// consecutive samples (gaps under a millisecond are one period seen
    /// twice), or `None` before any process has two.
    fn period_us(&self) -> Option<u64> {
        let mut by_pid: HashMap<u32, Vec<u64>> = HashMap::new();
        for (_, s) in &self.samples {
            by_pid.entry(s.pid).or_default().push(s.at_us);
        }
        let mut gaps: Vec<u64> = by_pid
            .into_values()
            .flat_map(|mut times| {
                times.sort_unstable();
                times.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>()
            })
            .filter(|&gap| gap >= 1_000)
            .collect();
        gaps.sort_unstable();
        gaps.get(gaps.len() / 2).copied()
    }

    /// The share of the last window, in percent, in which `pids` ran
    /// kernels: each of their samples counts its share of one sampling
    /// period; other processes' samples are not theirs; at most 100.
    pub fn percent(&self, now: Instant, pids: &[u32]) -> u32 {
        let window_us = WINDOW.as_micros() as u64;
        // A lone sample stands for the whole window.
        let period_us = self.period_us().unwrap_or(window_us).min(window_us);
        let busy: u64 = self
            .samples
            .iter()
            .filter(|(t, s)| now.duration_since(*t) <= WINDOW && pids.contains(&s.pid))
            .map(|(_, s)| u64::from(s.sm) * period_us)
            .sum();
        ((busy as f64 / window_us as f64).round() as u64).min(100) as u32
    }
}

/// One GPU as the samples see it.
#[derive(Debug, Default)]
struct Gpu {
    /// NVML's handle; `None` where NVML does not know the UUID.
    handle: Option<usize>,
    samples: DeviceSamples,
    polled: Option<Instant>,
    /// Whether a failed query was logged already.
    failure_told: bool,
}

/// The per-process samples of the server's GPUs, from NVIDIA's NVML, loaded
/// at the first question (never where nothing asks).
#[derive(Default)]
pub struct ProcessSamples {
    /// Where to look for NVML; `None`: [`candidates`].
    paths: Option<Vec<PathBuf>>,
    nvml: OnceLock<Option<Nvml>>,
    gpus: Mutex<HashMap<[u8; 16], Gpu>>,
}

impl ProcessSamples {
    /// Samples from the NVML at `path` alone.
    pub fn from_library(path: PathBuf) -> Self {
        ProcessSamples {
            paths: Some(vec![path]),
            ..Self::default()
        }
    }

    /// The share of the last second in which the processes `pids` ran
    /// kernels on the GPU whose UUID is `uuid`, in percent; `None` where
    /// there is no NVIDIA NVML or it does not know the GPU.
    pub fn percent(&self, uuid: &[u8; 16], pids: &[u32]) -> Option<u32> {
        let nvml = self
            .nvml
            .get_or_init(|| Nvml::find(&self.paths.clone().unwrap_or_else(candidates)))
            .as_ref()?;
        let now = Instant::now();
        let mut gpus = lock(&self.gpus);
        let gpu = gpus.entry(*uuid).or_insert_with(|| {
            let handle = nvml.device(uuid);
            if handle.is_none() {
                let uuid = cumux_protocol::visible_devices::uuid_text(uuid);
                tracing::debug!("NVIDIA's NVML does not know {uuid}: no per-process samples");
            }
            Gpu {
                handle,
                ..Gpu::default()
            }
        });
        let handle = gpu.handle?;
        // Tenants of one GPU ask in turn: one query serves them all.
        if gpu
            .polled
            .is_none_or(|t| now.duration_since(t) >= SAMPLE_EVERY / 2)
        {
            gpu.polled = Some(now);
            match nvml.samples(handle, gpu.samples.last_seen_us) {
                Ok(answer) => gpu.samples.add(now, answer),
                Err(rc) if !gpu.failure_told => {
                    gpu.failure_told = true;
                    tracing::debug!("nvmlDeviceGetProcessUtilization answered {rc}");
                }
                Err(_) => {}
            }
        }
        Some(gpu.samples.percent(now, pids))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn sample(pid: u32, at_ms: u64, sm: u32) -> Sample {
        Sample {
            pid,
            at_us: 5_000_000 + at_ms * 1_000,
            sm,
        }
    }

    /// A second of 100 ms periods, each answered as it comes: processes 1, 2
    /// and 9 at 30, 20 and 90 %.
    fn busy_second(gpu: &mut DeviceSamples, t0: Instant) {
        for i in 0..10u64 {
            let at = 100 * i;
            let answer = vec![sample(1, at, 30), sample(2, at, 20), sample(9, at, 90)];
            gpu.add(t0 + MS * at as u32, answer);
        }
    }

    #[test]
    fn a_tenants_share_is_its_processes_samples_over_the_window() {
        let mut gpu = DeviceSamples::default();
        let t0 = Instant::now();
        busy_second(&mut gpu, t0);
        let now = t0 + MS * 900;
        assert_eq!(gpu.percent(now, &[1, 2]), 50, "summed over its workers");
        assert_eq!(gpu.percent(now, &[1]), 30);
        assert_eq!(
            gpu.percent(now, &[4]),
            0,
            "other processes' samples are not its own"
        );
        assert_eq!(gpu.percent(now, &[1, 9]), 100, "at most 100");
        assert_eq!(gpu.percent(now, &[]), 0);
    }

    #[test]
    fn samples_older_than_the_window_drop_out() {
        let mut gpu = DeviceSamples::default();
        let t0 = Instant::now();
        busy_second(&mut gpu, t0);
        // Half a second on, half the samples (0 to 400 ms) are out of the window.
        gpu.add(t0 + MS * 1450, Vec::new());
        assert_eq!(gpu.percent(t0 + MS * 1450, &[1, 2]), 25);
        gpu.add(t0 + MS * 2500, Vec::new());
        assert_eq!(gpu.percent(t0 + MS * 2500, &[1, 2]), 0);
        // Kept no longer than the history.
        gpu.add(t0 + MS * 9000, Vec::new());
        assert!(gpu.samples.is_empty());
    }

    #[test]
    fn a_first_answer_keeps_only_its_last_window_and_repeats_are_dropped() {
        let mut gpu = DeviceSamples::default();
        let t0 = Instant::now();
        // The driver's buffer: 3 s of 100 ms periods at 50 %.
        let buffer: Vec<Sample> = (0..30).map(|i| sample(1, 100 * i, 50)).collect();
        gpu.add(t0, buffer.clone());
        assert_eq!(gpu.samples.len(), 10);
        assert_eq!(gpu.percent(t0, &[1]), 50);
        // The same samples again (an answer since an older time) add nothing.
        gpu.add(t0 + MS * 100, buffer);
        assert_eq!(gpu.percent(t0 + MS * 100, &[1]), 50);
    }

    #[test]
    fn idle_periods_count_as_idle() {
        let mut gpu = DeviceSamples::default();
        let t0 = Instant::now();
        // Process 1 ran in 2 of 10 periods (samples come only for periods
        // where a process ran), process 2 in all.
        for i in 0..10u64 {
            let at = 100 * i;
            let mut answer = vec![sample(2, at, 10)];
            if i < 2 {
                answer.push(sample(1, at, 80));
            }
            gpu.add(t0 + MS * at as u32, answer);
        }
        assert_eq!(gpu.percent(t0 + MS * 900, &[1]), 16);
        assert_eq!(gpu.percent(t0 + MS * 900, &[2]), 10);
    }

    #[test]
    fn a_lone_sample_stands_for_the_window() {
        let mut gpu = DeviceSamples::default();
        let t0 = Instant::now();
        gpu.add(t0, vec![sample(1, 0, 40)]);
        assert_eq!(gpu.percent(t0, &[1]), 40);
    }

    /// `fake_nvml.c`-like source built with the system C compiler as
    /// `<name>.so` in the temp folder, or `None` without one.
    fn build_fake(name: &str, source: &str, defines: &[&str]) -> Option<PathBuf> {
        let dir = std::env::temp_dir();
        let stem = format!("cumux-{name}-{}", std::process::id());
        let c = dir.join(format!("{stem}.c"));
        let so = dir.join(format!("{stem}.so"));
        std::fs::write(&c, source).ok()?;
        let built = std::process::Command::new("cc")
            .args(["-shared", "-fPIC"])
            .args(defines)
            .arg("-o")
            .arg(&so)
            .arg(&c)
            .status()
            .is_ok_and(|s| s.success());
        built.then_some(so)
    }

    /// An NVML that knows one GPU (UUID bytes 0x11…) and samples processes
    /// 111, 222 and 333 at 30, 20 and 90 % every 100 ms of real time.
    const FAKE_NVML: &str = r#"
#include <stddef.h>
#include <string.h>
#include <sys/time.h>
#ifdef MARKED
const char CUMUX_NVML[6] = "cumux";
#endif
typedef struct { unsigned pid; unsigned long long ts; unsigned sm, mem, enc, dec; } sample;
static int device;
int nvmlInit_v2(void) { return 0; }
int nvmlDeviceGetHandleByUUID(const char *uuid, void **out) {
  if (strcmp(uuid, "GPU-11111111-1111-1111-1111-111111111111")) return 6;
  *out = &device;
  return 0;
}
int nvmlDeviceGetProcessUtilization(void *d, sample *out, unsigned *count, unsigned long long since) {
  static const unsigned pids[3] = {111, 222, 333}, sms[3] = {30, 20, 90};
  struct timeval tv;
  gettimeofday(&tv, NULL);
  unsigned long long now = tv.tv_sec * 1000000ULL + tv.tv_usec, period = 100000;
  unsigned long long first = now - 2000000;
  if (since > first) first = since;
  first = first / period * period + period;
  unsigned n = 0;
  for (unsigned long long t = first; t <= now; t += period) n += 3;
  if (d != &device) return 2;
  if (n == 0) return 6;
  if (!out) { *count = n; return 7; }
  if (*count < n) { *count = n; return 7; }
  n = 0;
  for (unsigned long long t = first; t <= now; t += period)
    for (int i = 0; i < 3; i++) {
      sample s = {pids[i], t, sms[i], 0, 0, 0};
      out[n++] = s;
    }
  *count = n;
  return 0;
}
"#;

    #[test]
    fn samples_come_from_nvidias_nvml_by_uuid() {
        let Some(path) = build_fake("fake-nvml", FAKE_NVML, &[]) else {
            eprintln!("no C compiler: skipping");
            return;
        };
        let samples = ProcessSamples::from_library(path);
        let gpu = [0x11; 16];
        assert_eq!(
            samples.percent(&[0x22; 16], &[111]),
            None,
            "a GPU NVML does not know"
        );
        for _ in 0..12 {
            samples.percent(&gpu, &[111]);
            std::thread::sleep(SAMPLE_EVERY);
        }
        let ours = samples.percent(&gpu, &[111, 222]).unwrap();
        assert!((45..=55).contains(&ours), "{ours}");
        assert_eq!(samples.percent(&gpu, &[111, 333]), Some(100));
        assert_eq!(samples.percent(&gpu, &[444]), Some(0));
    }

    #[test]
    fn cumuxs_own_nvml_is_never_loaded_as_nvidias() {
        let Some(path) = build_fake("marked-nvml", FAKE_NVML, &["-DMARKED"]) else {
            eprintln!("no C compiler: skipping");
            return;
        };
        let why = open(&path).err().expect("refused");
        assert_eq!(why, "it is cumux's own NVML");
        let samples = ProcessSamples::from_library(path);
        assert_eq!(samples.percent(&[0x11; 16], &[111]), None);
        assert!(open(Path::new("/nonexistent/libnvidia-ml.so.1")).is_err());
    }
}
