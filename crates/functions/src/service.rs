//! The functions a server holds: who owns each, where its module is loaded,
//! and the requests about them (register, list, describe, remove, invoke),
//! each answered or refused with a [`Failure`]. Transport-free: the HTTP layer
//! calls these from a blocking thread, except an invocation's start and
//! finish, which do not wait (its answer is awaited in between).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cumux_server::tenants::TenantSettings;
use cumux_server::Server;
use serde_json::{json, Value as Json};

use crate::failure::Failure;
use crate::invoke::{self, Invocation};
use crate::job::Pending;
use crate::lane::Lane;
use crate::plan::{link, BufferKind, DType, Plan};
use crate::tensors::{self, Request, Tensor};

/// Most functions one tenant may hold.
pub const MAX_FUNCTIONS_PER_TENANT: usize = 256;
/// Longest function name (bytes).
pub const MAX_FUNCTION_NAME: usize = 64;
/// Most tenants a function may be shared with.
pub const MAX_INVOKERS: usize = 64;

/// Where a function's module is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The tenant's first GPU, else its first device.
    Auto,
    Gpu,
    Cpu,
}

impl Placement {
    pub fn parse(text: Option<&str>) -> Result<Placement, Failure> {
        match text {
            None | Some("auto") => Ok(Placement::Auto),
            Some("gpu") | Some("cuda") => Ok(Placement::Gpu),
            Some("cpu") => Ok(Placement::Cpu),
            Some(other) => Err(Failure::BadRequest(format!(
                "device: {other:?} is not auto, gpu or cpu"
            ))),
        }
    }
}

/// The limits of the service.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most bytes of one request body (module and plan, or inputs).
    pub max_body_bytes: usize,
    /// An invocation's deadline when the request gives none.
    pub default_deadline: Duration,
    /// The longest deadline a request may ask for.
    pub max_deadline: Duration,
    /// Most lanes (sessions) of one tenant on one device: up to this many of
    /// its invocations there run at once.
    pub lanes_per_device: usize,
}

/// [`Limits::lanes_per_device`] unless configured: one. Each lane is a
/// session, and on a GPU in isolated mode a context of its own: on the H100
/// 4 lanes of one tenant served `vadd` at 6,480/s from 16 clients where one
/// lane served 22,510/s (contexts time-slice the GPU). More lanes pay where
/// one long invocation would hold up short ones.
pub const DEFAULT_LANES_PER_DEVICE: usize = 1;
/// The most [`Limits::lanes_per_device`] may be.
pub const MAX_LANES_PER_DEVICE: usize = 64;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 256 << 20,
            default_deadline: Duration::from_secs(60),
            max_deadline: Duration::from_secs(600),
            lanes_per_device: DEFAULT_LANES_PER_DEVICE,
        }
    }
}

struct Entry {
    owner: String,
    /// The server's ordinal of the device its module is on.
    device: usize,
    plan: Arc<Plan>,
    doc: Json,
    kernels: Vec<String>,
    image: Arc<Vec<u8>>,
    /// Which registration this is (server-wide, rising): a lane holding an
    /// older one's module loads this one.
    version: u64,
    /// Other tenants that may invoke it (each in its own lane: its quota,
    /// its share of the device).
    invokers: Vec<String>,
}

impl Entry {
    fn may_invoke(&self, tenant: &str) -> bool {
        self.owner == tenant || self.invokers.iter().any(|t| t == tenant)
    }
}

/// One tenant's lanes on one device, the first where its functions are
/// registered.
type Lanes = Vec<Arc<Lane>>;

/// Every registered function and the lanes that run them.
pub struct Functions {
    server: Arc<Server>,
    pub limits: Limits,
    registry: Mutex<BTreeMap<String, Entry>>,
    /// Each tenant's lanes on each device; the first is where its functions
    /// are registered, the others load a module at their first invocation
    /// of it.
    lanes: Mutex<HashMap<(String, usize), Lanes>>,
    stats: crate::metrics::Stats,
    versions: std::sync::atomic::AtomicU64,
    drain: Drain,
}

/// The service's stop: once the server drains, new requests are refused and
/// those in flight may finish.
#[derive(Debug, Default)]
struct Drain {
    taking: AtomicBool,
    at_once: AtomicBool,
    since: OnceLock<Instant>,
    /// Requests being served; the lanes read it too.
    in_flight: Arc<AtomicUsize>,
    /// Requests begun so far.
    begun: AtomicU64,
}

/// An invocation queued on its lane ([`Functions::start_invoke`]).
pub struct Invoking {
    /// Its outputs, once the lane ran it.
    pub answer: Pending<BTreeMap<String, Tensor>>,
    /// What [`Functions::finish_invoke`] counts it by.
    pub record: InvokeRecord,
}

/// Whose invocation of what, since when.
pub struct InvokeRecord {
    tenant: String,
    function: String,
    started: Instant,
}

/// A request being served (see [`Functions::begin`]); done at drop.
pub struct InFlight<'a>(&'a Functions);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.drain.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn check_function_name(name: &str) -> Result<(), Failure> {
    let ok = !name.is_empty()
        && name.len() <= MAX_FUNCTION_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    match ok {
        true => Ok(()),
        false => Err(Failure::BadRequest(format!(
            "name: {name:?} is not a function name (1 to {MAX_FUNCTION_NAME} of letters, digits, _ - .)"
        ))),
    }
}

impl Functions {
    pub fn new(server: Arc<Server>, limits: Limits) -> Functions {
        Functions {
            server,
            limits,
            registry: Mutex::new(BTreeMap::new()),
            lanes: Mutex::new(HashMap::new()),
            stats: crate::metrics::Stats::default(),
            versions: std::sync::atomic::AtomicU64::new(1),
            drain: Drain {
                taking: AtomicBool::new(true),
                ..Drain::default()
            },
        }
    }

    /// Starts serving a request, unless the server is shutting down.
    pub fn begin(&self) -> Result<InFlight<'_>, Failure> {
        self.drain.in_flight.fetch_add(1, Ordering::SeqCst);
        self.drain.begun.fetch_add(1, Ordering::Relaxed);
        let guard = InFlight(self);
        match self.drain.taking.load(Ordering::SeqCst) {
            true => Ok(guard),
            false => Err(Failure::Busy(
                "the server is shutting down: it takes no new requests".into(),
            )),
        }
    }

    /// Whether one request alone is being served (the caller's own).
    pub fn alone(&self) -> bool {
        self.drain.in_flight.load(Ordering::Relaxed) == 1
    }

    /// How many requests have begun so far: a number that moves when
    /// another comes.
    pub fn begun(&self) -> u64 {
        self.drain.begun.load(Ordering::Relaxed)
    }

    /// Takes no new requests from now on; `at_once`: nor waits for those in
    /// flight ([`Functions::wait_idle`]).
    pub fn stop_taking(&self, at_once: bool) {
        let _ = self.drain.since.set(Instant::now());
        self.drain.taking.store(false, Ordering::SeqCst);
        if at_once {
            self.drain.at_once.store(true, Ordering::SeqCst);
        }
    }

    /// Waits until no request is in flight, at most `grace` after
    /// [`Functions::stop_taking`] (or a second stop): how many still are.
    pub fn wait_idle(&self, grace: Duration) -> usize {
        self.stop_taking(false);
        let since = *self.drain.since.get_or_init(Instant::now);
        loop {
            let left = self.drain.in_flight.load(Ordering::SeqCst);
            if left == 0 || self.drain.at_once.load(Ordering::SeqCst) || since.elapsed() >= grace {
                return left;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The tenant whose token `token` is (`Authorization: Bearer TOKEN`).
    pub fn authenticate(&self, token: Option<&str>) -> Result<(String, TenantSettings), Failure> {
        let token = token.ok_or_else(|| {
            Failure::Unauthorized("a tenant's token is needed: Authorization: Bearer TOKEN".into())
        })?;
        match self.server.tenants().admit(None, None, Some(token)) {
            // The admin token names no tenant: it is no proof of one here.
            Ok((name, settings)) if settings.token.is_some() => Ok((name, settings)),
            Ok(_) => Err(Failure::Unauthorized(
                "the token given names no tenant (the admin token cannot own functions)".into(),
            )),
            Err(why) => Err(Failure::Unauthorized(why)),
        }
    }

    /// The server ordinal of the device `placement` picks among the tenant's.
    fn place(&self, settings: &TenantSettings, placement: Placement) -> Result<usize, Failure> {
        let devices = self.server.devices_for(settings);
        let backend = |want: &str| devices.iter().find(|(d, _)| d.info().backend == want);
        let chosen = match placement {
            Placement::Cpu => backend("cpu").ok_or_else(|| {
                Failure::BadRequest("device: this server serves the tenant no CPU device".into())
            })?,
            Placement::Gpu => backend("cuda").ok_or_else(|| {
                Failure::BadRequest("device: this server serves the tenant no GPU".into())
            })?,
            Placement::Auto => backend("cuda").or(devices.first()).ok_or_else(|| {
                Failure::BadRequest("device: the tenant may use no device of this server".into())
            })?,
        };
        self.server
            .devices()
            .iter()
            .position(|d| Arc::ptr_eq(d, &chosen.0))
            .ok_or_else(|| Failure::Internal("a device the server does not list".into()))
    }

    /// Most lanes of one tenant on one device.
    fn lanes_per_device(&self) -> usize {
        self.limits.lanes_per_device.clamp(1, MAX_LANES_PER_DEVICE)
    }

    fn start_lane(
        &self,
        tenant: &(String, TenantSettings),
        device: usize,
    ) -> Result<Arc<Lane>, Failure> {
        let dev = self
            .server
            .devices()
            .get(device)
            .ok_or_else(|| Failure::Internal(format!("no device {device}")))?;
        let lanes = self.lanes_per_device();
        Ok(Arc::new(Lane::start(
            Arc::clone(&self.server),
            tenant.clone(),
            dev,
            lanes,
            Arc::clone(&self.drain.in_flight),
        )?))
    }

    /// The tenant's first lane on `device` (started if need be): where its
    /// functions there are registered.
    fn lane(&self, tenant: &(String, TenantSettings), device: usize) -> Result<Arc<Lane>, Failure> {
        let mut lanes = lock(&self.lanes);
        let group = lanes.entry((tenant.0.clone(), device)).or_default();
        if let Some(lane) = group.first() {
            return Ok(Arc::clone(lane));
        }
        let lane = self.start_lane(tenant, device)?;
        group.push(Arc::clone(&lane));
        Ok(lane)
    }

    /// The lane an invocation runs on: an idle lane of the tenant's on
    /// `device`, else a new one while it has fewer than
    /// [`Limits::lanes_per_device`] there, else its least loaded.
    fn invocation_lane(
        &self,
        tenant: &(String, TenantSettings),
        device: usize,
    ) -> Result<Arc<Lane>, Failure> {
        let most = self.lanes_per_device();
        let mut lanes = lock(&self.lanes);
        let group = lanes.entry((tenant.0.clone(), device)).or_default();
        let least = group.iter().min_by_key(|lane| lane.load()).cloned();
        match least {
            Some(lane) if lane.load() == 0 || group.len() >= most => Ok(lane),
            least => match self.start_lane(tenant, device) {
                Ok(lane) => {
                    group.push(Arc::clone(&lane));
                    Ok(lane)
                }
                Err(failure) => least.ok_or(failure),
            },
        }
    }

    /// Every lane of `tenant` on `device`.
    fn lanes_of(&self, tenant: &str, device: usize) -> Vec<Arc<Lane>> {
        lock(&self.lanes)
            .get(&(tenant.to_string(), device))
            .cloned()
            .unwrap_or_default()
    }

    /// The entry `name`, if `tenant` owns it.
    fn owned<T>(
        &self,
        tenant: &str,
        name: &str,
        f: impl FnOnce(&Entry, &BTreeMap<String, Entry>) -> T,
    ) -> Result<T, Failure> {
        self.entry(name, |e| e.owner == tenant, f)
    }

    /// The entry `name`, if `tenant` may invoke it (its owner, or one it is
    /// shared with).
    fn invocable<T>(
        &self,
        tenant: &str,
        name: &str,
        f: impl FnOnce(&Entry, &BTreeMap<String, Entry>) -> T,
    ) -> Result<T, Failure> {
        self.entry(name, |e| e.may_invoke(tenant), f)
    }

    fn entry<T>(
        &self,
        name: &str,
        allowed: impl FnOnce(&Entry) -> bool,
        f: impl FnOnce(&Entry, &BTreeMap<String, Entry>) -> T,
    ) -> Result<T, Failure> {
        let registry = lock(&self.registry);
        let entry = registry
            .get(name)
            .ok_or_else(|| Failure::NotFound(format!("no function {name:?}")))?;
        if !allowed(entry) {
            return Err(Failure::Forbidden(format!(
                "function {name:?} is another tenant's"
            )));
        }
        Ok(f(entry, &registry))
    }

    /// Registers (or replaces) function `name` of `tenant`: the module loaded
    /// on the device, the plan checked against its kernels and the functions
    /// it calls. A description of it.
    /// `invokers` are the other tenants that may invoke it.
    pub fn register(
        &self,
        tenant: &(String, TenantSettings),
        name: &str,
        placement: Placement,
        module: Vec<u8>,
        plan_doc: Json,
        invokers: Vec<String>,
    ) -> Result<Json, Failure> {
        check_function_name(name)?;
        if invokers.len() > MAX_INVOKERS {
            return Err(Failure::BadRequest(format!(
                "invokers: at most {MAX_INVOKERS} tenants"
            )));
        }
        if let Some((i, bad)) = invokers.iter().enumerate().find(|(_, t)| {
            t.is_empty()
                || t.len() > cumux_server::tenants::MAX_TENANT_NAME
                || t.chars().any(char::is_control)
        }) {
            return Err(Failure::BadRequest(format!(
                "invokers[{i}]: {bad:?} is not a tenant name"
            )));
        }
        let plan_bytes = serde_json::to_vec(&plan_doc)
            .map_err(|e| Failure::Internal(format!("the plan: {e}")))?;
        let plan = Arc::new(crate::plan::parse(&plan_bytes).map_err(Failure::BadRequest)?);
        if module.is_empty() {
            return Err(Failure::BadRequest("module: empty".into()));
        }
        let device = self.place(&tenant.1, placement)?;
        // What the checks need from the registry, taken now.
        let (callees, callers, previous_device) = {
            let registry = lock(&self.registry);
            let mine = registry.values().filter(|e| e.owner == tenant.0).count();
            match registry.get(name) {
                Some(e) if e.owner != tenant.0 => {
                    return Err(Failure::Forbidden(format!(
                        "function {name:?} is another tenant's"
                    )))
                }
                None if mine >= MAX_FUNCTIONS_PER_TENANT => {
                    return Err(Failure::Conflict(format!(
                        "a tenant may hold {MAX_FUNCTIONS_PER_TENANT} functions"
                    )))
                }
                _ => {}
            }
            let callees: HashMap<String, Arc<Plan>> = registry
                .iter()
                .filter(|(n, e)| e.owner == tenant.0 && e.device == device && n.as_str() != name)
                .map(|(n, e)| (n.clone(), Arc::clone(&e.plan)))
                .collect();
            let callers: Vec<(String, Arc<Plan>, usize)> = registry
                .iter()
                .filter(|(_, e)| {
                    e.owner == tenant.0 && e.plan.calls().iter().any(|c| c.function == name)
                })
                .map(|(n, e)| (n.clone(), Arc::clone(&e.plan), e.device))
                .collect();
            (callees, callers, registry.get(name).map(|e| e.device))
        };
        link::check_calls(name, &plan, &|n| callees.get(n).cloned())
            .map_err(Failure::BadRequest)?;
        // Functions that call this one must still fit it.
        let mut with_new = callees.clone();
        with_new.insert(name.to_string(), Arc::clone(&plan));
        for (caller, caller_plan, caller_device) in &callers {
            if *caller_device != device {
                return Err(Failure::Conflict(format!(
                    "function {caller:?} calls {name:?} on device {caller_device}; it cannot move to device {device}"
                )));
            }
            link::check_calls(caller, caller_plan, &|n| with_new.get(n).cloned()).map_err(
                |why| {
                    Failure::Conflict(format!(
                        "function {caller:?} calls {name:?} and would break: {why}"
                    ))
                },
            )?;
        }
        let lane = self.lane(tenant, device)?;
        let image = Arc::new(module);
        let kept_image = Arc::clone(&image);
        let version = self
            .versions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let checked_plan = Arc::clone(&plan);
        let fname = name.to_string();
        let deadline = Instant::now() + self.limits.max_deadline;
        let kernels = lane.run(deadline, move |state| {
            let info = state.load_candidate(&image)?;
            let names: Vec<String> = info.functions.iter().map(|f| f.name.clone()).collect();
            let find = |k: &str| info.functions.iter().find(|f| f.name == k).cloned();
            if let Err(why) = link::check_kernels(&checked_plan, &find, &names, &state.limits) {
                state.unload_module(info.module);
                return Err(Failure::BadRequest(why));
            }
            state.commit(&fname, image, version, info);
            Ok(names)
        })?;
        // Another tenant may have taken the name meanwhile: the first stays.
        let taken = lock(&self.registry)
            .get(name)
            .is_some_and(|e| e.owner != tenant.0);
        if taken {
            self.unload_on(tenant, device, name);
            return Err(Failure::Forbidden(format!(
                "function {name:?} is another tenant's"
            )));
        }
        if let Some(old) = previous_device.filter(|d| *d != device) {
            self.unload_on(tenant, old, name);
        }
        let mut registry = lock(&self.registry);
        registry.insert(
            name.to_string(),
            Entry {
                owner: tenant.0.clone(),
                device,
                plan,
                doc: plan_doc,
                kernels,
                image: kept_image,
                version,
                invokers,
            },
        );
        tracing::info!(tenant = %tenant.0, function = name, device, "function registered");
        Ok(self.describe_entry(name, &registry[name]))
    }

    fn unload_on(&self, tenant: &(String, TenantSettings), device: usize, name: &str) {
        for lane in self.lanes_of(&tenant.0, device) {
            let fname = name.to_string();
            let deadline = Instant::now() + self.limits.max_deadline;
            let _ = lane.run(deadline, move |state| {
                state.remove(&fname);
                Ok(())
            });
        }
    }

    fn describe_entry(&self, name: &str, e: &Entry) -> Json {
        let buffers = |kind: BufferKind| -> Vec<Json> {
            e.plan
                .of_kind(kind)
                .map(|(_, b)| {
                    let mut d = json!({"name": b.name, "dtype": b.dtype.name()});
                    if let Some(shape) = &b.shape {
                        let dims: Vec<Json> = shape
                            .iter()
                            .map(|e| e.as_ref().map_or(Json::Null, |e| json!(e.to_string())))
                            .collect();
                        d["shape"] = Json::Array(dims);
                    }
                    d
                })
                .collect()
        };
        let device = self.server.devices().get(e.device).map(|d| d.info());
        json!({
            "name": name,
            "tenant": e.owner,
            "device": e.device,
            "backend": device.map(|i| i.backend.to_string()),
            "device_name": device.map(|i| i.name.clone()),
            "kernels": e.kernels,
            "invokers": e.invokers,
            "inputs": buffers(BufferKind::Input),
            "outputs": buffers(BufferKind::Output),
            "params": e.plan.params.iter().map(|p| json!({"name": p.name, "dtype": p.dtype.name()})).collect::<Vec<_>>(),
            "plan": e.doc,
        })
    }

    /// The tenant's functions, described.
    pub fn list(&self, tenant: &str) -> Json {
        let registry = lock(&self.registry);
        let list: Vec<Json> = registry
            .iter()
            .filter(|(_, e)| e.may_invoke(tenant))
            .map(|(n, e)| self.describe_entry(n, e))
            .collect();
        json!({ "functions": list })
    }

    /// Function `name`, described (to its owner and those it is shared with).
    pub fn describe(&self, tenant: &str, name: &str) -> Result<Json, Failure> {
        self.invocable(tenant, name, |e, _| self.describe_entry(name, e))
    }

    /// Removes function `name` (refused while another function calls it).
    pub fn remove(&self, tenant: &(String, TenantSettings), name: &str) -> Result<(), Failure> {
        let device = self.owned(&tenant.0, name, |e, registry| {
            let caller = registry.iter().find(|(_, other)| {
                other.owner == tenant.0 && other.plan.calls().iter().any(|c| c.function == name)
            });
            match caller {
                Some((caller, _)) => Err(Failure::Conflict(format!(
                    "function {caller:?} calls {name:?}: remove it first"
                ))),
                None => Ok(e.device),
            }
        })??;
        lock(&self.registry).remove(name);
        self.stats.forget(name);
        // Every lane on its device may hold it (those of tenants it was shared with).
        let lanes: Vec<Arc<Lane>> = lock(&self.lanes)
            .iter()
            .filter(|((_, d), _)| *d == device)
            .flat_map(|(_, group)| group.iter().cloned())
            .collect();
        for lane in lanes {
            let fname = name.to_string();
            let deadline = Instant::now() + self.limits.max_deadline;
            let _ = lane.run(deadline, move |state| {
                state.remove(&fname);
                Ok(())
            });
        }
        tracing::info!(tenant = %tenant.0, function = name, "function removed");
        Ok(())
    }

    /// The dtype of each input of function `name` (for JSON bodies that give
    /// bare lists), if `tenant` may invoke it.
    pub fn input_dtypes(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<HashMap<String, DType>, Failure> {
        self.invocable(tenant, name, |e, _| {
            e.plan
                .of_kind(BufferKind::Input)
                .map(|(_, b)| (b.name.clone(), b.dtype))
                .collect()
        })
    }

    /// Invokes function `name` with `request`, within `deadline` (capped at
    /// the service's longest): its outputs.
    pub fn invoke(
        &self,
        tenant: &(String, TenantSettings),
        name: &str,
        request: Request,
        deadline: Option<Duration>,
    ) -> Result<BTreeMap<String, Tensor>, Failure> {
        let Invoking { answer, record } = self.start_invoke(tenant, name, request, deadline)?;
        let result = answer.wait();
        self.finish_invoke(record, result)
    }

    /// Queues an invocation of function `name` with `request` on its lane,
    /// within `deadline` (capped at the service's longest), without waiting
    /// for it: its answer comes through [`Invoking::answer`] (waited for, or
    /// polled and expired at its deadline), then goes to
    /// [`Functions::finish_invoke`].
    pub fn start_invoke(
        &self,
        tenant: &(String, TenantSettings),
        name: &str,
        request: Request,
        deadline: Option<Duration>,
    ) -> Result<Invoking, Failure> {
        let (plan, device, callees, modules) = self.invocable(&tenant.0, name, |e, registry| {
            let mut callees = HashMap::new();
            let mut modules =
                HashMap::from([(name.to_string(), (e.version, Arc::clone(&e.image)))]);
            let mut todo: Vec<Arc<Plan>> = vec![Arc::clone(&e.plan)];
            while let Some(p) = todo.pop() {
                for call in p.calls() {
                    if callees.contains_key(&call.function)
                        || callees.len() > MAX_FUNCTIONS_PER_TENANT
                    {
                        continue;
                    }
                    // A shared function's callees are its owner's, run as the invoker.
                    if let Some(callee) =
                        registry.get(&call.function).filter(|c| c.owner == e.owner)
                    {
                        callees.insert(call.function.clone(), Arc::clone(&callee.plan));
                        modules.insert(
                            call.function.clone(),
                            (callee.version, Arc::clone(&callee.image)),
                        );
                        todo.push(Arc::clone(&callee.plan));
                    }
                }
            }
            (Arc::clone(&e.plan), e.device, callees, modules)
        })?;
        let dtype_of = |n: &str| plan.params.iter().find(|p| p.name == n).map(|p| p.dtype);
        let params =
            tensors::typed_params(&request.params, &dtype_of).map_err(Failure::BadRequest)?;
        let wait = deadline
            .unwrap_or(self.limits.default_deadline)
            .min(self.limits.max_deadline);
        let env = invoke::prepare(&plan, &request.tensors, &params)?;
        let inv = Invocation {
            function: name.to_string(),
            plan,
            callees,
            modules,
            inputs: request.tensors,
            env,
            deadline: Instant::now() + wait,
        };
        let record = InvokeRecord {
            tenant: tenant.0.clone(),
            function: name.to_string(),
            started: Instant::now(),
        };
        let queued = self
            .invocation_lane(tenant, device)
            .and_then(|lane| lane.submit(inv.deadline, move |state| invoke::run(state, &inv)));
        match queued {
            Ok(answer) => Ok(Invoking { answer, record }),
            Err(failure) => {
                self.count(&record, failure.status());
                Err(failure)
            }
        }
    }

    /// Counts an invocation's answer: `result`, given back.
    pub fn finish_invoke(
        &self,
        record: InvokeRecord,
        result: Result<BTreeMap<String, Tensor>, Failure>,
    ) -> Result<BTreeMap<String, Tensor>, Failure> {
        self.count(&record, result.as_ref().err().map_or(200, Failure::status));
        result
    }

    fn count(&self, record: &InvokeRecord, status: u16) {
        let took = record.started.elapsed();
        self.stats
            .record(&record.tenant, &record.function, status, took);
    }

    /// The functions' metrics, in Prometheus' text format.
    pub fn metrics(&self) -> prometheus::Result<String> {
        let mut registered = BTreeMap::new();
        for e in lock(&self.registry).values() {
            *registered.entry(e.owner.clone()).or_insert(0) += 1;
        }
        let mut lanes: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for ((tenant, _), group) in lock(&self.lanes).iter() {
            let entry = lanes.entry(tenant.clone()).or_default();
            entry.0 += group.len();
            entry.1 += group.iter().map(|lane| lane.load()).sum::<usize>();
        }
        self.stats.render(&registered, &lanes)
    }
}
