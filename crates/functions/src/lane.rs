//! A lane: one tenant's server-side session on one device, owned by a thread
//! of its own that runs the lane's jobs (loads, unloads, invocations) one at
//! a time from a bounded queue, polling it a while before it sleeps (and its
//! session's worker polling for its calls) where the host has cores for it.
//! The session is an ordinary one (quotas, the gate, fault handling); after a
//! fatal fault or a cancel it is rebuilt with every module of the lane loaded
//! again.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cumux_protocol::hop_trace::{self, Hop};
use cumux_protocol::launch_checks::LaunchLimits;
use cumux_protocol::{Call, ClientRole, CuError, Hello, ModuleInfo, ReplyBody};
use cumux_server::device::spin;
use cumux_server::session::Session;
use cumux_server::tenants::{TenantClass, TenantSettings};
use cumux_server::{Device, Server};

use crate::failure::Failure;
use crate::job::{self, Canceller, Pending};

/// Jobs one lane may hold queued; past it a request is told the lane is busy.
pub const MAX_QUEUED: usize = 64;

/// Bytes of free buffers a lane keeps for later invocations, at most (and at
/// most a quarter of the tenant's memory quota: they count against it; an
/// allocation of the lane over the quota empties the pool first).
pub const MAX_POOL_BYTES: u64 = 256 << 20;
/// The smallest buffer the pool hands out.
const MIN_BUFFER: u64 = 256;

/// A job: runs on the lane's thread with its state.
type Job = Box<dyn FnOnce(&mut LaneState) + Send>;

/// A module of one function, loaded in the lane's session (or to be).
struct Loaded {
    image: Arc<Vec<u8>>,
    /// The registration it is of (a function registered again is loaded again).
    version: u64,
    info: Option<ModuleInfo>,
}

/// A buffer of the lane's session: its address, size class, whether it is
/// known to be all zeros, and the session it belongs to.
#[derive(Debug, Clone, Copy)]
pub struct Buffer {
    pub ptr: u64,
    pub class: u64,
    /// A pooled buffer: zeroed on its way back (by the default stream's
    /// order, before anything the taker queues). A new one may hold anything.
    pub zeroed: bool,
    generation: u64,
}

/// The state a lane's thread owns.
pub struct LaneState {
    server: Arc<Server>,
    tenant: (String, TenantSettings),
    /// The device's position among the tenant's devices.
    position: usize,
    session: Option<Session>,
    modules: BTreeMap<String, Loaded>,
    /// Free buffers of the session by size class (a power of two), each
    /// zeroed on its way back (see [`LaneState::give_back`]).
    pool: BTreeMap<u64, Vec<u64>>,
    pool_bytes: u64,
    /// Buffers of the last job, to scrub and pool once its answer is out
    /// (see [`LaneState::give_back_later`]).
    later: Vec<Buffer>,
    /// How many sessions the lane has opened: a buffer is given back only to
    /// the session it came from.
    generation: u64,
    pub limits: LaunchLimits,
    /// Most bytes the pool keeps.
    pool_limit: u64,
    cancel: Arc<Mutex<Option<Canceller>>>,
    poisoned: Arc<AtomicBool>,
    /// How long the lane polls for its next job before it sleeps.
    poll: Duration,
    /// Requests the service is serving: the lane polls only for a lone one's
    /// successor.
    in_flight: Arc<AtomicUsize>,
}

/// One tenant's queue of work on one device (a tenant may have several on a
/// device, each with a session of its own: see `service`).
pub struct Lane {
    jobs: SyncSender<Job>,
    /// Jobs queued or running on the lane.
    load: Arc<AtomicUsize>,
    cancel: Arc<Mutex<Option<Canceller>>>,
    poisoned: Arc<AtomicBool>,
    /// Where the lane runs, for messages.
    pub device_name: String,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Lane {
    /// Starts a lane of `tenant` on `device` (one of the tenant's), one of at
    /// most `lanes` of the tenant there (their pools share
    /// [`MAX_POOL_BYTES`]); `in_flight` counts the service's requests.
    pub fn start(
        server: Arc<Server>,
        tenant: (String, TenantSettings),
        device: &Arc<dyn Device>,
        lanes: usize,
        in_flight: Arc<AtomicUsize>,
    ) -> Result<Lane, Failure> {
        let position = server
            .devices_for(&tenant.1)
            .iter()
            .position(|(d, _)| Arc::ptr_eq(d, device))
            .ok_or_else(|| {
                Failure::Forbidden(format!("tenant {:?} may not use that device", tenant.0))
            })?;
        let limits = LaunchLimits::of(&device.info().attributes);
        let (jobs, queue) = sync_channel::<Job>(MAX_QUEUED);
        let cancel = Arc::new(Mutex::new(None));
        let poisoned = Arc::new(AtomicBool::new(false));
        let device_name = format!("{} ({})", device.info().name, device.info().backend);
        let pool_limit = tenant
            .1
            .memory_quota
            .map_or(MAX_POOL_BYTES, |quota| MAX_POOL_BYTES.min(quota / 4))
            / lanes.max(1) as u64;
        let state = LaneState {
            server,
            tenant: tenant.clone(),
            position,
            session: None,
            modules: BTreeMap::new(),
            pool: BTreeMap::new(),
            pool_bytes: 0,
            later: Vec::new(),
            generation: 0,
            limits,
            pool_limit,
            cancel: Arc::clone(&cancel),
            poisoned: Arc::clone(&poisoned),
            poll: match tenant.1.class {
                TenantClass::LatencyCritical => spin::hot_spin_time(),
                TenantClass::Batch => job::answer_poll(),
            },
            in_flight,
        };
        std::thread::Builder::new()
            .name(format!("cumux-fn-{}", tenant.0))
            .spawn(move || serve(state, queue))
            .map_err(|e| Failure::Internal(format!("cannot start the tenant's lane: {e}")))?;
        Ok(Lane {
            jobs,
            load: Arc::new(AtomicUsize::new(0)),
            cancel,
            poisoned,
            device_name,
        })
    }

    /// Jobs queued or running on the lane now.
    pub fn load(&self) -> usize {
        self.load.load(Ordering::SeqCst)
    }

    /// Runs `job` on the lane and waits for its answer until `deadline` (see
    /// [`Pending::wait`]).
    pub fn run<T: Send + 'static>(
        &self,
        deadline: Instant,
        job: impl FnOnce(&mut LaneState) -> Result<T, Failure> + Send + 'static,
    ) -> Result<T, Failure> {
        self.submit(deadline, job)?.wait()
    }

    /// Queues `job` on the lane: its answer, to wait for or poll. Past
    /// `deadline` a job still queued never runs (see [`Pending::expire`]).
    pub fn submit<T: Send + 'static>(
        &self,
        deadline: Instant,
        job: impl FnOnce(&mut LaneState) -> Result<T, Failure> + Send + 'static,
    ) -> Result<Pending<T>, Failure> {
        let (mut ticket, pending) = job::pair(
            deadline,
            Arc::clone(&self.poisoned),
            Arc::clone(&self.cancel),
        );
        let busy = Busy::new(&self.load);
        let boxed: Job = Box::new(move |state: &mut LaneState| {
            let busy = busy;
            if ticket.start() {
                hop_trace::mark(Hop::Step, "fn-lane-start");
                let answer = job(state);
                hop_trace::mark(Hop::Step, "fn-lane-answer");
                // Idle before the waiter hears: its next request may come here.
                drop(busy);
                ticket.answer(answer);
            }
        });
        match self.jobs.try_send(boxed) {
            Ok(()) => Ok(pending),
            Err(TrySendError::Full(_)) => Err(Failure::Busy(format!(
                "{MAX_QUEUED} requests are already queued for this tenant's device; retry later"
            ))),
            Err(TrySendError::Disconnected(_)) => {
                Err(Failure::Internal("the tenant's lane has stopped".into()))
            }
        }
    }
}

/// A job counted in its lane's load from its submission until it ran or was
/// dropped.
struct Busy(Arc<AtomicUsize>);

impl Busy {
    fn new(load: &Arc<AtomicUsize>) -> Busy {
        load.fetch_add(1, Ordering::SeqCst);
        Busy(Arc::clone(load))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The lane's thread: one job at a time until every sender is gone.
fn serve(mut state: LaneState, queue: Receiver<Job>) {
    let poll = state.poll;
    let limited = state.tenant.1.class == TenantClass::Batch;
    let in_flight = Arc::clone(&state.in_flight);
    let lone = move || in_flight.load(Ordering::Relaxed) <= 1;
    while let Some(job) = next_job(&queue, poll, limited, &lone) {
        // The job answers its waiter first; what it left for later follows.
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            job(&mut state);
            state.tidy();
        }));
        if ran.is_err() {
            tracing::error!(tenant = %state.tenant.0, "a function job panicked; rebuilding the lane's session");
            state.poisoned.store(true, Ordering::SeqCst);
        }
    }
    state.close();
}

/// The lane's next job, polled for during `poll` before the lane sleeps: a
/// job that comes that soon (the next request of a client that waits for
/// each answer) costs no wake-up. A batch tenant's lane polls only while few
/// others do and while the service serves one request alone (`lone`): under
/// load the next job is queued already or the core is wanted for serving.
/// `None` once every sender is gone.
fn next_job(
    queue: &Receiver<Job>,
    poll: Duration,
    limited: bool,
    lone: &dyn Fn() -> bool,
) -> Option<Job> {
    // A latency-critical tenant's lane always polls, as the server's
    // threads poll for its sessions.
    let polls = !poll.is_zero() && (!limited || lone());
    let place = match limited && polls {
        true => job::Poller::take(),
        false => None,
    };
    if polls && (!limited || place.is_some()) {
        let until = Instant::now() + poll;
        loop {
            match queue.try_recv() {
                Ok(job) => return Some(job),
                Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty) if Instant::now() >= until => break,
                Err(TryRecvError::Empty) if limited && !lone() => break,
                Err(TryRecvError::Empty) => std::hint::spin_loop(),
            }
        }
    }
    // Asleep, it is no poller.
    drop(place);
    queue.recv().ok()
}

/// A device error of `during`.
pub fn device(during: impl Into<String>, error: CuError) -> Failure {
    Failure::Device {
        during: during.into(),
        error,
    }
}

impl LaneState {
    /// The lane's session: opened (and every module loaded) if there is none,
    /// or if the last one met a fatal fault or a cancel.
    fn session(&mut self) -> Result<&mut Session, Failure> {
        let broken = self.poisoned.swap(false, Ordering::SeqCst);
        if broken {
            if let Some(old) = self.session.take() {
                tracing::info!(tenant = %self.tenant.0, session = old.id(), "rebuilding a function lane's session");
                old.close();
            }
            self.pool.clear();
            self.pool_bytes = 0;
            for loaded in self.modules.values_mut() {
                loaded.info = None;
            }
        }
        if self.session.is_none() {
            let hello = Hello {
                magic: cumux_protocol::MAGIC,
                version: cumux_protocol::PROTOCOL_VERSION,
                pid: std::process::id(),
                role: ClientRole::Driver,
                program: format!("cumux-functions ({})", self.tenant.0),
                tenant: Some(self.tenant.0.clone()),
                token: None,
                shm: false,
                visible_devices: Some(self.position.to_string()),
                join: None,
                resume: None,
                lane: None,
            };
            let session =
                Session::open(Arc::clone(&self.server), &hello, Some(self.tenant.clone()))
                    .map_err(|e| device("opening the tenant's session", e))?;
            *lock(&self.cancel) = Some(Box::new(session.canceller()));
            // The worker polls for the lane's next call as the lane polls for
            // its next job (a latency-critical tenant's session is hot already).
            if self.tenant.1.class == TenantClass::Batch && !self.poll.is_zero() {
                session.keep_hot(self.poll);
            }
            // What the lane posts (an invocation's copy in and launches, the
            // scrub of its buffers after its answer) rings no sleeping worker:
            // the next call that waits (an invocation's read of its outputs)
            // rings once for all, and the worker answers once.
            session.hold_posts(true);
            self.session = Some(session);
            self.generation += 1;
            self.pool.clear();
            self.pool_bytes = 0;
            for loaded in self.modules.values_mut() {
                loaded.info = None;
            }
        }
        let names: Vec<String> = self
            .modules
            .iter()
            .filter(|(_, l)| l.info.is_none())
            .map(|(n, _)| n.clone())
            .collect();
        for name in names {
            let image = match self.modules.get(&name) {
                Some(l) => Arc::clone(&l.image),
                None => continue,
            };
            let info = self
                .load_image(&image)
                .map_err(|e| device(format!("loading the module of function {name:?} again"), e))?;
            if let Some(l) = self.modules.get_mut(&name) {
                l.info = Some(info);
            }
        }
        self.session
            .as_mut()
            .ok_or_else(|| Failure::Internal("no session".into()))
    }

    fn load_image(&mut self, image: &[u8]) -> Result<ModuleInfo, CuError> {
        let reply = self.raw_call(Call::ModuleLoad {
            image: image.to_vec(),
        })?;
        match reply {
            ReplyBody::Module(info) => Ok(info),
            other => Err(CuError::new(
                cumux_protocol::codes::UNKNOWN,
                format!("a module load answered {other:?}"),
            )),
        }
    }

    /// One call on the session as it is (no rebuild); a fire-and-forget call
    /// answers `Unit` (its failure comes at the next synchronize).
    fn raw_call(&mut self, call: Call) -> Result<ReplyBody, CuError> {
        let session = self
            .session
            .as_mut()
            .ok_or_else(|| CuError::new(cumux_protocol::codes::INVALID_CONTEXT, "no session"))?;
        let result = session.handle(call).unwrap_or(Ok(ReplyBody::Unit));
        if let Err(e) = &result {
            if cumux_protocol::codes::is_fatal(e.code) {
                self.poisoned.store(true, Ordering::SeqCst);
            }
        }
        result
    }

    /// One call on the lane's session (opened or rebuilt first if need be).
    pub fn call(&mut self, call: Call) -> Result<ReplyBody, CuError> {
        self.session().map_err(|f| match f {
            Failure::Device { error, .. } => error,
            other => CuError::new(cumux_protocol::codes::UNKNOWN, other.to_string()),
        })?;
        self.raw_call(call)
    }

    /// Loads `image` in the lane's session, not yet as any function's
    /// module (see [`LaneState::commit`]); a module the device refuses is a
    /// bad request.
    pub fn load_candidate(&mut self, image: &[u8]) -> Result<ModuleInfo, Failure> {
        self.session()?;
        self.load_image(image).map_err(|e| {
            Failure::BadRequest(format!(
                "module: the device cannot load it: {}: {}",
                crate::failure::cuda_error_name(e.code),
                e.detail
            ))
        })
    }

    /// Makes a module [`LaneState::load_candidate`] loaded function `name`'s;
    /// the module it replaces is unloaded.
    pub fn commit(&mut self, name: &str, image: Arc<Vec<u8>>, version: u64, info: ModuleInfo) {
        let loaded = Loaded {
            image,
            version,
            info: Some(info),
        };
        if let Some(Loaded {
            info: Some(old), ..
        }) = self.modules.insert(name.to_string(), loaded)
        {
            let _ = self.raw_call(Call::ModuleUnload { module: old.module });
        }
    }

    /// Unloads a candidate module whose checks failed.
    pub fn unload_module(&mut self, module: u64) {
        let _ = self.raw_call(Call::ModuleUnload { module });
    }

    /// Forgets function `name`'s module (unloading it); the session closes
    /// when the lane has no module left.
    pub fn remove(&mut self, name: &str) {
        if let Some(Loaded {
            info: Some(info), ..
        }) = self.modules.remove(name)
        {
            let _ = self.raw_call(Call::ModuleUnload {
                module: info.module,
            });
        }
        if self.modules.is_empty() {
            self.close();
        }
    }

    /// Device printf output the session gathered since last asked (kept out
    /// of every answer; logged at debug level).
    fn drain_stdout(&mut self) {
        if let Some(session) = &self.session {
            let out = session.take_stdout();
            if !out.is_empty() {
                tracing::debug!(tenant = %self.tenant.0, "device printf: {}", String::from_utf8_lossy(&out));
            }
        }
    }

    /// The module of registration `version` of function `name` (its
    /// `image`), loaded in this lane's session now if it is not yet (a lane
    /// of a tenant the owner shares the function with, or after the owner
    /// registered it again).
    pub fn module(
        &mut self,
        name: &str,
        version: u64,
        image: &Arc<Vec<u8>>,
    ) -> Result<ModuleInfo, Failure> {
        self.session()?;
        if let Some(Loaded {
            version: v,
            info: Some(info),
            ..
        }) = self.modules.get(name)
        {
            if *v == version {
                return Ok(info.clone());
            }
        }
        let info = self
            .load_image(image)
            .map_err(|e| device(format!("loading the module of function {name:?}"), e))?;
        self.commit(name, Arc::clone(image), version, info.clone());
        Ok(info)
    }

    /// The size class of a buffer of `bytes`.
    pub fn size_class(bytes: u64) -> u64 {
        bytes
            .max(MIN_BUFFER)
            .checked_next_power_of_two()
            .unwrap_or(bytes)
    }

    /// A buffer of size class `class` ([`LaneState::size_class`]): one the
    /// pool holds (all zeros), else a new allocation (not cleared); over the
    /// quota the pool is emptied and it is tried again.
    pub fn take_buffer(&mut self, class: u64) -> Result<Buffer, CuError> {
        // A broken session is rebuilt first: its pool went with it.
        self.session().map_err(|f| match f {
            Failure::Device { error, .. } => error,
            other => CuError::new(cumux_protocol::codes::UNKNOWN, other.to_string()),
        })?;
        let generation = self.generation;
        if let Some(ptr) = self.pool.get_mut(&class).and_then(Vec::pop) {
            self.pool_bytes -= class;
            return Ok(Buffer {
                ptr,
                class,
                zeroed: true,
                generation,
            });
        }
        let alloc = Call::MemAlloc {
            device: 0,
            bytes: class,
        };
        let reply = match self.call(alloc.clone()) {
            Err(e) if e.code == cumux_protocol::codes::OUT_OF_MEMORY && self.pool_bytes > 0 => {
                self.drain_pool();
                self.call(alloc)?
            }
            other => other?,
        };
        match reply {
            ReplyBody::Ptr(ptr) => Ok(Buffer {
                ptr,
                class,
                zeroed: false,
                generation: self.generation,
            }),
            other => Err(CuError::new(
                cumux_protocol::codes::UNKNOWN,
                format!("an allocation answered {other:?}"),
            )),
        }
    }

    /// Gives a buffer back to the pool (freed if the pool is full, or if the
    /// session it came from is gone).
    pub fn give_back(&mut self, buffer: Buffer) {
        let Buffer {
            ptr,
            class,
            generation,
            ..
        } = buffer;
        if self.poisoned.load(Ordering::SeqCst) || generation != self.generation {
            return; // the session it came from is (or will be) gone, and its memory with it
        }
        // Zeroed on its way back, so that no pooled buffer holds data an
        // out-of-bounds read of a later invocation could find, and its next
        // taker need not zero it. Queued on the default stream unwaited: what
        // the next taker queues runs after it; a failure of it fails the
        // session's next synchronizing call (a fatal one rebuilds the
        // session, and its pool with it).
        let zero = Call::Memset {
            dst: ptr,
            value: 0,
            elem_bytes: 1,
            count: class,
            pitch: class,
            height: 1,
            stream: Some(cumux_protocol::DEFAULT_STREAM),
        };
        let zeroed = self.raw_call(zero).is_ok();
        if zeroed && self.pool_bytes + class <= self.pool_limit {
            self.pool.entry(class).or_default().push(ptr);
            self.pool_bytes += class;
        } else {
            let _ = self.raw_call(Call::MemFree { ptr });
        }
    }

    /// Gives `buffer` back ([`LaneState::give_back`]) once the running job
    /// has answered, before the lane's next job: its scrub is off the
    /// answer's path.
    pub fn give_back_later(&mut self, buffer: Buffer) {
        self.later.push(buffer);
    }

    /// What the last job left for after its answer: its buffers given back,
    /// the device's printf output logged.
    fn tidy(&mut self) {
        for buffer in std::mem::take(&mut self.later) {
            self.give_back(buffer);
        }
        self.drain_stdout();
    }

    /// Frees every pooled buffer.
    pub fn drain_pool(&mut self) {
        for ptr in std::mem::take(&mut self.pool).into_values().flatten() {
            let _ = self.raw_call(Call::MemFree { ptr });
        }
        self.pool_bytes = 0;
    }

    fn close(&mut self) {
        self.pool.clear();
        self.pool_bytes = 0;
        *lock(&self.cancel) = None;
        if let Some(session) = self.session.take() {
            session.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        Box::new(|_: &mut LaneState| {})
    }

    #[test]
    fn a_polling_lane_takes_a_job_that_comes_during_its_poll_or_after_it() {
        let (jobs, queue) = sync_channel::<Job>(MAX_QUEUED);
        let poll = Duration::from_millis(50);
        // Queued before: taken at once.
        jobs.send(job()).unwrap();
        assert!(next_job(&queue, poll, false, &|| true).is_some());
        // Sent during the poll, then after it (the lane asleep by then).
        for delay in [Duration::from_millis(5), Duration::from_millis(120)] {
            let sender = jobs.clone();
            let sent = std::thread::spawn(move || {
                std::thread::sleep(delay);
                sender.send(job()).unwrap();
            });
            assert!(next_job(&queue, poll, true, &|| true).is_some());
            sent.join().unwrap();
            // With other requests in flight a batch lane sleeps at once,
            // and the job still reaches it.
            let sender = jobs.clone();
            let sent = std::thread::spawn(move || {
                std::thread::sleep(delay);
                sender.send(job()).unwrap();
            });
            assert!(next_job(&queue, poll, true, &|| false).is_some());
            sent.join().unwrap();
        }
        // Every sender gone: the lane ends, polling or not.
        drop(jobs);
        assert!(next_job(&queue, poll, false, &|| true).is_none());
        assert!(next_job(&queue, Duration::ZERO, true, &|| true).is_none());
    }
}
