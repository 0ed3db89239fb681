//! The `Client`: the connection to the server, the devices it described at
//! the handshake, and the `State` behind the client's one lock.
//!
//! Lock discipline: an exported call takes the state lock once, finds and
//! checks everything it needs and records what it changes, and lets it go
//! before its message leaves; the connection's own lock is held for one
//! message (and its reply, when the call waits for one). The state lock is
//! never held across a round trip: a call that must record a server's answer
//! (a handle, an allocation) takes it again afterwards, and a synchronising
//! call takes it again only when host functions or managed memory are
//! waiting for the synchronisation. Waiting for a stream's host functions or
//! a lazy library releases it (`Client::wait`).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use cumux_protocol::address::{server_addresses, ServerAddress};
use cumux_protocol::launch_checks::LaunchLimits;
use cumux_protocol::{Call, DeviceInfo, Handle, Join, ReplyBody, NEW_GROUP};

use super::current::current_device;
use super::handles::FIRST_MINTED;
use super::objects::State;
use super::placements::Placements;
use super::window::reserve_device_window;
use crate::errors::*;
use crate::routing::{device_of_access, device_of_call};
use crate::transport::{visible_devices, Connection, Link, Session};

/// The connection for one of the program's devices: a session of its own on
/// its server, opened when the device is first used (the first device's at
/// `cuInit`).
struct DeviceLink {
    link: OnceLock<Link>,
    /// Whether a call went to it yet (its first is logged).
    used: AtomicBool,
    /// Its server (in `Client::servers`) and its number there.
    server: usize,
    local: u32,
}

/// One of the servers whose devices the program uses (`CUMUX_SERVER` lists
/// them; their devices follow one another in the program's numbering).
struct ServerLink {
    address: ServerAddress,
    /// The program's group there: the key of its first welcome from this
    /// server, [`NEW_GROUP`] until then.
    group: AtomicU64,
    /// Which of the tenant's devices there the program sees, in its order
    /// (every hello there says so).
    visible: Option<String>,
}

/// The state, locked.
pub type StateGuard<'a> = MutexGuard<'a, State>;

pub struct Client {
    /// How calls reach the server: one link per device (`transport::Link`).
    links: Vec<DeviceLink>,
    servers: Vec<ServerLink>,
    /// Held while a link opens.
    opening: Mutex<()>,
    /// Which device each allocation is on, for calls named by a pointer.
    placements: Placements,
    state: Mutex<State>,
    /// Signalled when a stream's host functions have all run and when a
    /// lazy library has been loaded.
    changed: Condvar,
    next_handle: AtomicUsize,
    /// How many server handles the client has chosen ([`Client::mint_wire`]).
    wire_minted: AtomicU64,
    pub server: String,
    pub session: u64,
    pub devices: Vec<DeviceInfo>,
    /// Each device's launch limits, from its attributes.
    pub launch_limits: Vec<LaunchLimits>,
}

static CLIENT: OnceLock<Arc<Client>> = OnceLock::new();
static INIT_LOCK: Mutex<()> = Mutex::new(());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The handle a reply names.
fn handle_of(reply: ReplyBody) -> CuResult<Handle> {
    match reply {
        ReplyBody::Handle(h) => Ok(h),
        _ => Err(CUDA_ERROR_UNKNOWN),
    }
}

/// Connects to the server once; later calls return the same client.
pub fn init() -> CuResult<&'static Client> {
    if let Some(c) = CLIENT.get() {
        return Ok(c);
    }
    let _guard = lock(&INIT_LOCK);
    if let Some(c) = CLIENT.get() {
        return Ok(c);
    }
    // An empty list hides every device, as with NVIDIA's driver (no server asked).
    if std::env::var("CUDA_VISIBLE_DEVICES").is_ok_and(|v| v.trim().is_empty()) {
        tracing::debug!("cuInit: CUDA_VISIBLE_DEVICES is empty: no device");
        return Err(CUDA_ERROR_NO_DEVICE);
    }
    reserve_device_window();
    match connect_all() {
        Ok(client) => {
            let _ = CLIENT.set(Arc::new(client));
            Ok(CLIENT.get().expect("just set"))
        }
        Err(e) => {
            tracing::warn!("cuInit: {e}");
            Err(CUDA_ERROR_NO_DEVICE)
        }
    }
}

/// The program's first session and the devices it may use: one server's
/// (which applies `CUDA_VISIBLE_DEVICES` itself), or those of every server
/// `CUMUX_SERVER` lists, numbered one server after another unless
/// `CUDA_VISIBLE_DEVICES` (applied here to them all) orders them otherwise.
fn connect_all() -> Result<Client, String> {
    let addresses = server_addresses()?;
    if addresses.len() == 1 {
        let visible = visible_devices();
        let (conn, first) = Connection::connect(&addresses[0], None, visible.clone())?;
        let count = first.devices.len() as u32;
        let servers = vec![ServerLink {
            address: addresses[0].clone(),
            group: AtomicU64::new(first.group),
            visible,
        }];
        let devices = first.devices.clone();
        let places = (0..count).map(|local| (0, local)).collect();
        return Ok(Client::new(conn, first, servers, devices, places));
    }
    // Every server's devices, then the program's choice among them.
    let mut offered = Vec::new();
    for (at, address) in addresses.iter().enumerate() {
        let listed = Connection::devices_at(address)?.devices;
        if listed.is_empty() {
            return Err(format!("the server at {address} offers no device"));
        }
        offered.extend(
            listed
                .into_iter()
                .enumerate()
                .map(|(i, d)| (at, i as u32, d)),
        );
    }
    let chosen: Vec<usize> = match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(text) => {
            let uuids: Vec<[u8; 16]> = offered.iter().map(|(_, _, d)| d.uuid).collect();
            let selection = cumux_protocol::visible_devices::select(&text, &uuids);
            if let Some(why) = &selection.stopped {
                tracing::warn!("CUDA_VISIBLE_DEVICES={text:?}: {why}; the list ends there");
            }
            selection.chosen
        }
        Err(_) => (0..offered.len()).collect(),
    };
    if chosen.is_empty() {
        return Err("CUDA_VISIBLE_DEVICES shows none of the servers' devices".into());
    }
    // Each server sees its chosen devices, in the program's order.
    let mut per_server: Vec<Vec<u32>> = vec![Vec::new(); addresses.len()];
    let mut places = Vec::new();
    let mut devices = Vec::new();
    for &i in &chosen {
        let (at, number, info) = &offered[i];
        places.push((*at, per_server[*at].len() as u32));
        per_server[*at].push(*number);
        devices.push(info.clone());
    }
    let servers: Vec<ServerLink> = addresses
        .iter()
        .zip(&per_server)
        .map(|(address, numbers)| ServerLink {
            address: address.clone(),
            group: AtomicU64::new(NEW_GROUP),
            visible: Some(
                numbers
                    .iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        })
        .collect();
    // Peers, numbered by each server among its devices, are renumbered as
    // the program numbers them; devices of two servers are never peers.
    for (ordinal, info) in devices.iter_mut().enumerate() {
        let (at, _) = places[ordinal];
        let server_numbers = &per_server[at];
        info.peers = info
            .peers
            .iter()
            .filter_map(|&(peer, attributes)| {
                let local = server_numbers.iter().position(|n| *n == peer)?;
                let program = places.iter().position(|p| *p == (at, local as u32))?;
                Some((program as u32, attributes))
            })
            .collect();
    }
    let (at, _) = places[0];
    let server = &servers[at];
    let (conn, first) = Connection::connect(&server.address, None, server.visible.clone())?;
    server.group.store(first.group, Ordering::Release);
    tracing::info!(
        "{} devices on {} servers: {}",
        devices.len(),
        addresses.len(),
        addresses
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(Client::new(conn, first, servers, devices, places))
}

impl Client {
    /// A client whose device 0 is `conn`'s session (`first`), and whose
    /// devices are `devices`, each at `places` (its server, its number among
    /// the devices it sees there).
    fn new(
        conn: Connection,
        first: Session,
        servers: Vec<ServerLink>,
        devices: Vec<DeviceInfo>,
        places: Vec<(usize, u32)>,
    ) -> Client {
        tracing::info!(
            "connected to {} (session {}, {} devices)",
            first.server,
            first.session,
            devices.len()
        );
        let links: Vec<DeviceLink> = places
            .into_iter()
            .map(|(server, local)| DeviceLink {
                link: OnceLock::new(),
                used: AtomicBool::new(false),
                server,
                local,
            })
            .collect();
        let _ = links[0].link.set(Link::new(conn));
        Client {
            links,
            servers,
            opening: Mutex::new(()),
            placements: Placements::default(),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            next_handle: AtomicUsize::new(FIRST_MINTED),
            wire_minted: AtomicU64::new(0),
            server: first.server,
            session: first.session,
            launch_limits: devices
                .iter()
                .map(|d| LaunchLimits::of(&d.attributes))
                .collect(),
            devices,
        }
    }
}

/// The client, once `cuInit` has succeeded.
pub fn client() -> CuResult<&'static Client> {
    CLIENT.get().map(|c| &**c).ok_or(CUDA_ERROR_NOT_INITIALIZED)
}

impl Client {
    /// The client's one lock: all of its mutable state.
    pub fn lock(&self) -> StateGuard<'_> {
        lock(&self.state)
    }

    /// Waits, the lock let go meanwhile, until another thread says the state
    /// changed (`Client::changed`); the caller checks again what it waits for.
    pub fn wait<'a>(&'a self, s: StateGuard<'a>) -> StateGuard<'a> {
        self.changed.wait(s).unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes the threads in `Client::wait`.
    pub fn changed(&self) {
        self.changed.notify_all();
    }

    /// Before new work on `stream`: the stream must exist, and host
    /// functions queued on it must have run, so the work starts after them.
    pub fn ready_stream<'a>(
        &'a self,
        mut s: StateGuard<'a>,
        stream: Handle,
    ) -> CuResult<StateGuard<'a>> {
        s.check_stream(stream)?;
        while s.host_fns_pending(stream) {
            s = self.wait(s);
        }
        Ok(s)
    }

    /// The link of device `device`, opened now if it is not yet: a session
    /// of the program's group on that device. `kind` names the call it is
    /// for, in the log line of the device's first use.
    pub fn link(&self, device: u32, kind: &'static str) -> CuResult<&Link> {
        let slot = self
            .links
            .get(device as usize)
            .ok_or(CUDA_ERROR_INVALID_DEVICE)?;
        if !slot.used.swap(true, Ordering::Relaxed) {
            tracing::debug!(device, "device {device} is first used by {kind}");
        }
        if let Some(link) = slot.link.get() {
            return Ok(link);
        }
        let _opening = lock(&self.opening);
        if let Some(link) = slot.link.get() {
            return Ok(link);
        }
        let server = &self.servers[slot.server];
        let join = Join {
            group: server.group.load(Ordering::Acquire),
            device: slot.local,
            ordinal: device,
        };
        let (conn, session) =
            Connection::connect(&server.address, Some(join), server.visible.clone()).map_err(
                |e| {
                    tracing::warn!("cannot open a session for device {device}: {e}");
                    CUDA_ERROR_DEVICE_UNAVAILABLE
                },
            )?;
        if join.group == NEW_GROUP {
            server.group.store(session.group, Ordering::Release);
        }
        tracing::debug!(
            device,
            session = session.session,
            server = %server.address,
            "session opened for another device"
        );
        Ok(slot.link.get_or_init(|| Link::new(conn)))
    }

    /// The devices whose links are open, with them.
    pub fn opened_links(&self) -> impl Iterator<Item = (u32, &Link)> {
        self.links
            .iter()
            .enumerate()
            .filter_map(|(device, slot)| Some((device as u32, slot.link.get()?)))
    }

    /// The link of the device `call` is for (`crate::routing`).
    fn route(&self, call: &Call) -> CuResult<&Link> {
        self.link(device_of_call(call, &self.placements), call.into())
    }

    /// Sends a call to the session of the device it is for; waits for its
    /// reply unless it is fire-and-forget.
    pub fn call(&self, call: Call) -> CuResult<ReplyBody> {
        self.route(&call)?.call(call)
    }

    /// Sends a call to device `device`'s session.
    pub fn call_on(&self, device: u32, call: Call) -> CuResult<ReplyBody> {
        self.link(device, (&call).into())?.call(call)
    }

    /// Sends a call whose byte buffer, left empty in `call`, is `bytes`
    /// (through shared memory it is copied once, straight into the bulk ring).
    pub fn call_with_bytes(&self, call: Call, bytes: &[u8]) -> CuResult<ReplyBody> {
        self.route(&call)?.call_with_bytes(call, bytes)
    }

    /// A call that carries a descriptor (`Call::carries_fd`: a pinned
    /// region's memfd, an imported allocation's) to device `device`'s session.
    pub fn call_with_fd_on(
        &self,
        device: u32,
        call: Call,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> CuResult<ReplyBody> {
        self.link(device, (&call).into())?.call_with_fd(call, fd)
    }

    /// A call whose reply brings a descriptor (`Call::returns_fd`), to the
    /// session of the device it is for.
    pub fn call_for_fd(&self, call: Call) -> CuResult<(ReplyBody, std::os::fd::OwnedFd)> {
        self.route(&call)?.call_for_fd(call)
    }

    /// Makes a call answered with exactly `out.len()` bytes of data, received
    /// into `out` (through shared memory straight from the bulk ring).
    pub fn call_into(&self, call: Call, out: &mut [u8]) -> CuResult<()> {
        self.route(&call)?.call_into(call, out)
    }

    /// The device of a call on `stream` (if not the default stream) or else
    /// about device memory at `ptr`, else the current context's.
    pub fn device_for(&self, ptr: u64, stream: Option<Handle>) -> u32 {
        device_of_access(&self.placements, ptr, stream).unwrap_or_else(current_device)
    }

    /// Records memory of device `device` at `[base, base + size)`; refused
    /// where it overlaps another device's (see [`Placements::place`]), as
    /// calls naming it could not be routed.
    pub fn place(&self, base: u64, size: u64, device: u32) -> CuResult<()> {
        self.placements.place(base, size, device).map_err(|other| {
            tracing::error!(
                "device {device}'s memory at {base:#x} overlaps device {other}'s: their \
                 servers hand out the same addresses (CPU devices: give each server its own \
                 --cpu-window)"
            );
            CUDA_ERROR_OUT_OF_MEMORY
        })
    }

    /// Which device each allocation is on.
    pub fn placements(&self) -> &Placements {
        &self.placements
    }

    /// A call answered with a handle.
    pub fn call_for_handle(&self, call: Call) -> CuResult<Handle> {
        handle_of(self.call(call)?)
    }

    /// A call to device `device`'s session answered with a handle.
    pub fn call_for_handle_on(&self, device: u32, call: Call) -> CuResult<Handle> {
        handle_of(self.call_on(device, call)?)
    }

    /// A fresh handle for an object only the client keeps: never 0, 1 or 2
    /// (special stream values), never reused, never a server object's
    /// (`super::handles`).
    pub fn mint(&self) -> usize {
        self.next_handle.fetch_add(0x10, Ordering::Relaxed)
    }

    /// A handle for a new stream or event on `device` that the client
    /// chooses, so that making it costs no round trip
    /// (`protocol::minted_handle`); `None` once the range is spent.
    pub fn mint_wire(&self, device: u32) -> Option<Handle> {
        let n = self.wire_minted.fetch_add(1, Ordering::Relaxed);
        cumux_protocol::minted_handle(device, n)
    }

    /// Makes a stream or event on `device`: under a handle the client
    /// chooses, sent without waiting (`new(handle)`'s call), else by
    /// `answered`, whose answer names the server's handle.
    pub fn create_on(
        &self,
        device: u32,
        answered: Call,
        new: impl FnOnce(Handle) -> CuResult<Call>,
    ) -> CuResult<Handle> {
        match self.mint_wire(device) {
            Some(handle) => {
                self.call_on(device, new(handle)?)?;
                Ok(handle)
            }
            None => self.call_for_handle_on(device, answered),
        }
    }

    /// An event with `flags` on `device` (see [`Client::create_on`]).
    pub fn new_event(&self, device: u32, flags: u32) -> CuResult<Handle> {
        self.create_on(device, Call::EventCreate { flags }, |handle| {
            Ok(Call::NewEvent { handle, flags })
        })
    }

    pub fn device(&self, ordinal: i32) -> CuResult<&DeviceInfo> {
        usize::try_from(ordinal)
            .ok()
            .and_then(|i| self.devices.get(i))
            .ok_or(CUDA_ERROR_INVALID_DEVICE)
    }

    /// The launch limits of device `ordinal`.
    pub fn launch_limits(&self, ordinal: i32) -> CuResult<&LaunchLimits> {
        usize::try_from(ordinal)
            .ok()
            .and_then(|i| self.launch_limits.get(i))
            .ok_or(CUDA_ERROR_INVALID_DEVICE)
    }

    pub fn attribute(&self, ordinal: i32, attr: u32) -> CuResult<i32> {
        let dev = self.device(ordinal)?;
        Ok(dev
            .attributes
            .iter()
            .find(|(a, _)| *a == attr)
            .map(|(_, v)| *v)
            .unwrap_or(0))
    }

    /// Whether `device` is the CPU reference device (which runs PTX).
    pub fn on_cpu(&self, device: u32) -> bool {
        self.devices
            .get(device as usize)
            .is_some_and(|d| d.backend == "cpu")
    }

    /// Loads an image on `device`'s server context and registers its
    /// functions and globals (for `library`, when it loads one): the
    /// server's module handle.
    pub fn load_module(
        &self,
        device: u32,
        image: Vec<u8>,
        library: Option<usize>,
    ) -> CuResult<Handle> {
        let image = crate::conditional::resolve(image)?;
        // Only the CPU device needs PTX; a GPU runs the linked cubin.
        let on_cpu = self.on_cpu(device);
        let image = if on_cpu {
            crate::link::with_ptx(image)
        } else {
            image
        };
        let info = match self.call_on(
            device,
            Call::ModuleLoad {
                image: image.clone(),
            },
        ) {
            Ok(ReplyBody::Module(info)) => info,
            Ok(_) => return Err(CUDA_ERROR_UNKNOWN),
            // A fat binary of an `-rdc` program holds only the cubin nvlink
            // made (sm_75 by default): a newer GPU needs the program's
            // relocatable PTX, linked, which its driver JIT-compiles.
            Err(CUDA_ERROR_NO_BINARY_FOR_GPU) if !on_cpu => {
                let linked = crate::link::with_ptx(image);
                if cumux_fatbin::classify(&linked) == cumux_fatbin::Classified::Fatbin {
                    return Err(CUDA_ERROR_NO_BINARY_FOR_GPU);
                }
                tracing::debug!("no cubin for this GPU: loading the program's relocatable PTX");
                match self.call_on(device, Call::ModuleLoad { image: linked })? {
                    ReplyBody::Module(info) => info,
                    _ => return Err(CUDA_ERROR_UNKNOWN),
                }
            }
            Err(e) => return Err(e),
        };
        let module = info.module;
        for global in &info.globals {
            self.place(global.ptr, global.size, device)?;
        }
        self.lock().add_module(info, library);
        Ok(module)
    }

    /// Unloads a module or library by the program's handle.
    pub fn unload_module(&self, program: usize) -> CuResult<()> {
        let wires = self.lock().remove_module(program)?;
        for module in wires {
            self.call(Call::ModuleUnload { module })?;
        }
        Ok(())
    }
}
