//! The loop: starts from a target's seeds and corpus folder, mutates a random
//! input of its pool ([`crate::mutate`]), checks it with panics captured
//! ([`crate::panics`]), keeps it when it shows a new feature, and saves each
//! new crash (and a hang, before the process ends) as a file of the corpus
//! folder, which [`replay`] checks forever after.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::features::Features;
use crate::mutate::{mutate, Rand};
use crate::panics::{self, PanicRecord};

/// One thing to fuzz.
pub struct Target {
    /// Also its corpus folder's name.
    pub name: &'static str,
    /// Checks one input: returns for every input, panics on a bug (a failed
    /// assertion of what must hold, or a panic of the code under test).
    pub check: fn(&[u8], &mut Features),
    /// Inputs to start from besides the corpus folder's files: the repo's
    /// fixtures, encoded examples.
    pub seeds: fn() -> Vec<Vec<u8>>,
    /// Tokens the mutations insert (keywords of a text format, magic numbers).
    pub dictionary: &'static [&'static [u8]],
    /// Longest input the loop makes.
    pub max_len: usize,
}

impl Target {
    /// Checks one input, as a cargo-fuzz target does (the features go unused).
    pub fn check_once(&self, data: &[u8]) {
        (self.check)(data, &mut Features::default());
    }
}

/// How long and how a run goes.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub duration: Duration,
    /// Stop after this many checks even if time is left.
    pub max_execs: Option<u64>,
    pub seed: u64,
    /// The folder holding one corpus folder per target.
    pub corpus: PathBuf,
    /// Save new crashes (and hangs) as files of the target's corpus folder.
    pub save: bool,
    /// A check that runs longer than this is a hang: the input is saved and the
    /// process exits.
    pub hang_limit: Duration,
    /// Print the counters this often (`None`: never).
    pub progress: Option<Duration>,
}

/// One distinct crash (by panic location) and the first input that caused it.
#[derive(Debug, Clone)]
pub struct Crash {
    pub panic: PanicRecord,
    pub input: Vec<u8>,
    pub saved: Option<PathBuf>,
    /// Inputs of the run that panicked at the same place.
    pub count: u64,
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct RunStats {
    pub target: &'static str,
    pub seed: u64,
    pub execs: u64,
    pub wall: Duration,
    /// Inputs the run started from (seeds and corpus files).
    pub started_with: usize,
    /// Inputs in the pool at the end.
    pub pool: usize,
    /// Distinct features seen.
    pub features: usize,
    pub slowest: Duration,
    pub crashes: Vec<Crash>,
}

/// A run of one target: the pool, what it has seen, and its counters.
pub struct Run<'t> {
    target: &'t Target,
    options: RunOptions,
    rand: Rand,
    pool: Vec<Vec<u8>>,
    /// The first inputs of the pool, which a full pool never replaces: the
    /// seeds and corpus files (the well-formed inputs mutations start from).
    protected: usize,
    seen: HashSet<u64>,
    features: Features,
    crashes: HashMap<String, Crash>,
    execs: u64,
    slowest: Duration,
    watch: Arc<Watch>,
}

/// The most inputs a pool keeps; past it a new one replaces a random one.
const MAX_POOL: usize = 2048;

/// The corpus root: `$CUMUX_FUZZ_CORPUS`, else this crate's `corpus` folder.
pub fn corpus_root() -> PathBuf {
    std::env::var_os("CUMUX_FUZZ_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus"))
}

/// Every file of `dir` (sorted by name), as (path, bytes); none if it is missing.
pub fn corpus_files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    paths
        .into_iter()
        .filter_map(|p| std::fs::read(&p).ok().map(|bytes| (p, bytes)))
        .collect()
}

/// Checks every seed and corpus file of `target` once; the inputs that panicked.
pub fn replay(target: &Target, corpus: &Path, hang_limit: Duration) -> Vec<(String, PanicRecord)> {
    // The inputs are in the corpus already: a hang is reported, not saved again.
    let watch = Watch::start(target.name, corpus.join(target.name), hang_limit, false);
    let seeds = (target.seeds)()
        .into_iter()
        .enumerate()
        .map(|(i, s)| (format!("built-in seed {i}"), s));
    let files = corpus_files(&corpus.join(target.name))
        .into_iter()
        .map(|(p, bytes)| (p.display().to_string(), bytes));
    let mut failed = Vec::new();
    let mut features = Features::default();
    for (label, input) in seeds.chain(files) {
        features.clear();
        watch.begin(&input);
        let result = panics::capture(|| (target.check)(&input, &mut features));
        watch.end();
        if let Err(panic) = result {
            failed.push((label, panic));
        }
    }
    watch.stop();
    failed
}

impl<'t> Run<'t> {
    pub fn new(target: &'t Target, options: RunOptions) -> Run<'t> {
        let watch = Watch::start(
            target.name,
            options.corpus.join(target.name),
            options.hang_limit,
            options.save,
        );
        Run {
            target,
            rand: Rand::seeded(options.seed),
            options,
            pool: Vec::new(),
            protected: 0,
            seen: HashSet::new(),
            features: Features::default(),
            crashes: HashMap::new(),
            execs: 0,
            slowest: Duration::ZERO,
            watch,
        }
    }

    /// Runs until the time or the check count is spent.
    pub fn run(mut self) -> RunStats {
        let started = Instant::now();
        let mut inputs = (self.target.seeds)();
        let folder = self.options.corpus.join(self.target.name);
        inputs.extend(corpus_files(&folder).into_iter().map(|(_, bytes)| bytes));
        let started_with = inputs.len();
        for input in inputs {
            self.execute(input, true);
        }
        if self.pool.is_empty() {
            self.pool.push(Vec::new());
        }
        self.protected = self.pool.len().min(MAX_POOL / 2);
        let deadline = started + self.options.duration;
        let mut next_report = self.options.progress.map(|p| started + p);
        while Instant::now() < deadline && self.options.max_execs.is_none_or(|m| self.execs < m) {
            let input = self.next_input();
            self.execute(input, false);
            if let Some(at) = next_report {
                if Instant::now() >= at {
                    self.report(started);
                    next_report = self.options.progress.map(|p| at + p);
                }
            }
        }
        self.watch.stop();
        let mut crashes: Vec<Crash> = self.crashes.into_values().collect();
        crashes.sort_by(|a, b| a.panic.location.cmp(&b.panic.location));
        RunStats {
            target: self.target.name,
            seed: self.options.seed,
            execs: self.execs,
            wall: started.elapsed(),
            started_with,
            pool: self.pool.len(),
            features: self.seen.len(),
            slowest: self.slowest,
            crashes,
        }
    }

    /// A mutation of a pool input, or now and then a few random bytes.
    fn next_input(&mut self) -> Vec<u8> {
        if self.rand.one_in(64) {
            let mut fresh = vec![0; self.rand.below(64)];
            self.rand.fill(&mut fresh);
            return fresh;
        }
        let parent = &self.pool[self.rand.below(self.pool.len())];
        let other = &self.pool[self.rand.below(self.pool.len())];
        let mut child = parent.clone();
        mutate(
            &mut self.rand,
            &mut child,
            other,
            self.target.dictionary,
            self.target.max_len,
        );
        child
    }

    /// Checks `input`; keeps it if it showed a new feature (or is a starting
    /// input), records it if it panicked.
    fn execute(&mut self, input: Vec<u8>, starting: bool) {
        self.features.clear();
        self.watch.begin(&input);
        let began = Instant::now();
        let result = panics::capture(|| (self.target.check)(&input, &mut self.features));
        self.slowest = self.slowest.max(began.elapsed());
        self.watch.end();
        self.execs += 1;
        match result {
            Ok(()) => {
                let mut new = false;
                for feature in self.features.iter() {
                    new |= self.seen.insert(feature);
                }
                if new || starting {
                    self.keep(input);
                }
            }
            Err(panic) => self.crashed(panic, input),
        }
    }

    fn keep(&mut self, input: Vec<u8>) {
        if self.pool.len() < MAX_POOL {
            self.pool.push(input);
        } else {
            let at = self.protected + self.rand.below(MAX_POOL - self.protected);
            self.pool[at] = input;
        }
    }

    fn crashed(&mut self, panic: PanicRecord, input: Vec<u8>) {
        if let Some(known) = self.crashes.get_mut(&panic.location) {
            known.count += 1;
            return;
        }
        let saved = self
            .options
            .save
            .then(|| save(&self.options.corpus.join(self.target.name), "crash", &input))
            .flatten();
        eprintln!(
            "cumux-fuzz {}: panic at {}: {}{}",
            self.target.name,
            panic.location,
            panic.message,
            saved
                .as_ref()
                .map(|p| format!(" (input saved as {})", p.display()))
                .unwrap_or_default()
        );
        self.crashes.insert(
            panic.location.clone(),
            Crash {
                panic,
                input,
                saved,
                count: 1,
            },
        );
    }

    fn report(&self, started: Instant) {
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "cumux-fuzz {}: {:.0}s, {} checks ({:.0}/s), pool {}, features {}, crashes {}",
            self.target.name,
            secs,
            self.execs,
            self.execs as f64 / secs.max(1e-9),
            self.pool.len(),
            self.seen.len(),
            self.crashes.len()
        );
    }
}

/// Writes `input` as `PREFIX-HASH` into `dir`; the path, or `None` if it failed.
pub fn save(dir: &Path, prefix: &str, input: &[u8]) -> Option<PathBuf> {
    let path = dir.join(format!("{prefix}-{:016x}", fnv1a(input)));
    let written = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, input));
    match written {
        Ok(()) => Some(path),
        Err(e) => {
            eprintln!("cumux-fuzz: cannot save {}: {e}", path.display());
            None
        }
    }
}

/// FNV-1a: a stable name for an input's file.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Watches the check in progress from a thread of its own: one that runs past
/// the hang limit has its input saved, and the process exits.
struct Watch {
    target: &'static str,
    folder: PathBuf,
    save: bool,
    /// Milliseconds since `epoch` when the current check began, plus one; 0 when idle.
    began_ms: AtomicU64,
    epoch: Instant,
    input: Mutex<Vec<u8>>,
    stopped: AtomicBool,
}

impl Watch {
    fn start(target: &'static str, folder: PathBuf, limit: Duration, save: bool) -> Arc<Watch> {
        let watch = Arc::new(Watch {
            target,
            folder,
            save,
            began_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            input: Mutex::new(Vec::new()),
            stopped: AtomicBool::new(false),
        });
        let watching = Arc::clone(&watch);
        std::thread::Builder::new()
            .name(format!("fuzz-watch-{target}"))
            .spawn(move || watching.watch(limit))
            .expect("spawn the hang watchdog");
        watch
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    fn begin(&self, input: &[u8]) {
        let mut held = self.input.lock().unwrap_or_else(|e| e.into_inner());
        held.clear();
        held.extend_from_slice(input);
        drop(held);
        self.began_ms.store(self.now_ms(), Ordering::Release);
    }

    fn end(&self) {
        self.began_ms.store(0, Ordering::Release);
    }

    fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
    }

    fn watch(&self, limit: Duration) {
        while !self.stopped.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(100));
            let began = self.began_ms.load(Ordering::Acquire);
            if began == 0 || self.now_ms() - began < limit.as_millis() as u64 {
                continue;
            }
            let input = self.input.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let saved = if self.save {
                save(&self.folder, "hang", &input)
            } else {
                None
            };
            eprintln!(
                "cumux-fuzz {}: a check ran for over {limit:?} on {} bytes{}; exiting",
                self.target,
                input.len(),
                saved
                    .map(|p| format!(" (input saved as {})", p.display()))
                    .unwrap_or_default()
            );
            std::process::exit(3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn picky(input: &[u8], features: &mut Features) {
        features.add(input.first());
        if input.starts_with(b"boom") {
            panic!("found it");
        }
    }

    const PICKY: Target = Target {
        name: "picky",
        check: picky,
        seeds: || vec![b"bo".to_vec()],
        dictionary: &[b"om"],
        max_len: 16,
    };

    #[test]
    fn a_panic_in_the_standard_library_names_its_caller() {
        let big = std::hint::black_box([u64::MAX, 2]);
        let panic = panics::capture(|| big.iter().product::<u64>()).unwrap_err();
        assert!(panic.location.starts_with("/rustc/"), "{panic:?}");
        assert!(panic.location.contains("src/engine.rs:"), "{panic:?}");
    }

    #[test]
    fn a_crash_is_found_saved_and_replayed() {
        let dir = std::env::temp_dir().join(format!("cumux-fuzz-engine-{}", std::process::id()));
        let options = RunOptions {
            duration: Duration::from_secs(20),
            max_execs: Some(200_000),
            seed: 1,
            corpus: dir.clone(),
            save: true,
            hang_limit: Duration::from_secs(60),
            progress: None,
        };
        let stats = Run::new(&PICKY, options).run();
        assert_eq!(stats.crashes.len(), 1, "{stats:?}");
        let crash = &stats.crashes[0];
        assert_eq!(crash.panic.message, "found it");
        assert!(crash.input.starts_with(b"boom"));
        let saved = crash.saved.as_ref().expect("saved");
        assert_eq!(std::fs::read(saved).unwrap(), crash.input);
        let failed = replay(&PICKY, &dir, Duration::from_secs(60));
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].1.message, "found it");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
