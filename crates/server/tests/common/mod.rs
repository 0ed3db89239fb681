//! Test harness: a live server over the model device on a unix socket in a
//! temporary folder, and a small protocol client that speaks to it (through a
//! shared-memory area unless `CUMUX_TRANSPORT=socket`).

#![allow(dead_code)]

use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cumux_protocol::shm::{self, Endpoint, ShmArea, Side};
use cumux_protocol::*;
use cumux_server::device::model::ModelDevice;
use cumux_server::tenants::TenantPolicy;
use cumux_server::{listener, Address, Device, Policy, Server};

pub struct Harness {
    pub server: Arc<Server>,
    pub device: Arc<ModelDevice>,
    pub socket: PathBuf,
    _dir: TempDir,
}

/// A folder removed at drop.
pub use cumux_testkit::TempDir;

impl Harness {
    pub fn start(tag: &str) -> Self {
        Self::start_with(tag, TenantPolicy::default(), 1)
    }

    /// A server over `devices` model devices of 1 GiB each (the first is
    /// `self.device`) whose tenants are those `tenants` admits.
    pub fn start_with(tag: &str, tenants: TenantPolicy, devices: usize) -> Self {
        let dir = TempDir::new(tag);
        let device = Arc::new(ModelDevice::new(1 << 30));
        let mut all = vec![device.clone() as Arc<dyn Device>];
        for _ in 1..devices {
            all.push(Arc::new(ModelDevice::new(1 << 30)) as Arc<dyn Device>);
        }
        let server = Server::with_tenants(all, tenants);
        Self::serve(dir, server, device)
    }

    /// A server over one serial model device (one launch at a time, in arrival
    /// order, like a GPU's queue) scheduled by `policy`.
    pub fn start_scheduled(tag: &str, tenants: TenantPolicy, policy: Policy) -> Self {
        let dir = TempDir::new(tag);
        let device = Arc::new(ModelDevice::serial(1 << 30));
        let server = Server::with_policy(vec![device.clone() as Arc<dyn Device>], tenants, policy);
        Self::serve(dir, server, device)
    }

    /// A server over one serial model device per entry of `policies` (the
    /// first is `self.device`), each scheduled by its own policy.
    pub fn start_with_policies(tag: &str, tenants: TenantPolicy, policies: Vec<Policy>) -> Self {
        let dir = TempDir::new(tag);
        let device = Arc::new(ModelDevice::serial(1 << 30));
        let mut all = vec![device.clone() as Arc<dyn Device>];
        for _ in 1..policies.len() {
            all.push(Arc::new(ModelDevice::serial(1 << 30)) as Arc<dyn Device>);
        }
        let server = Server::with_policies(all, tenants, policies);
        Self::serve(dir, server, device)
    }

    /// Serves `server` on a unix socket in `dir` from a thread of its own.
    fn serve(dir: TempDir, server: Arc<Server>, device: Arc<ModelDevice>) -> Self {
        let socket = serve_in(&dir, &server);
        Harness {
            server,
            device,
            socket,
            _dir: dir,
        }
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.socket, "test-program", Some("team-a"))
    }

    /// Waits until `cond` holds, failing the test after five seconds.
    pub fn eventually(&self, what: &str, cond: impl FnMut() -> bool) {
        eventually(what, cond);
    }

    /// Waits until every session has freed its memory and left the registry.
    pub fn all_released(&self) {
        self.eventually("every session's memory to be freed", || {
            self.device.mem_used() == 0
        });
        self.eventually("every session to leave the registry", || {
            self.server.registry().is_empty()
        });
    }
}

/// `rounds` rounds of `attack` on `h`, random by an `Rng` seeded with `seed`;
/// after every `check_every` rounds and at the end, `good` must still get its
/// work done, and then every session must go. What the rounds returned, summed.
pub fn survive(
    h: &Harness,
    seed: u64,
    (rounds, check_every): (u32, u32),
    good: impl Fn(&Harness),
    mut attack: impl FnMut(&mut cumux_testkit::Rng) -> u64,
) -> u64 {
    let mut rng = cumux_testkit::Rng(seed);
    let mut total = 0;
    for round in 1..=rounds {
        total += attack(&mut rng);
        if round % check_every == 0 {
            good(h);
        }
    }
    good(h);
    h.all_released();
    total
}

/// A well-behaved client `c` still gets its work done: `data` through its
/// memory and back, and a kernel's printf.
pub fn assert_client_works(mut c: Client, data: &[u8]) {
    let p = c.alloc(data.len() as u64);
    c.write(p, data);
    assert_eq!(c.read(p, data.len() as u64).unwrap(), data);
    let m = c.load("model:print");
    c.launch(&m, "print", DEFAULT_STREAM, 42u32.to_le_bytes().to_vec());
    assert_eq!(c.code(Call::ContextSynchronize), 0);
    assert_eq!(c.stdout, b"model 42\n");
}

/// Waits until `cond` holds, failing the test after five seconds.
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Serves `server` on a unix socket in `dir` from a thread of its own; the socket.
pub fn serve_in(dir: &TempDir, server: &Arc<Server>) -> PathBuf {
    let socket = dir.0.join("s.sock");
    let bound = listener::bind(&Address::Unix(socket.clone())).unwrap();
    let serving = Arc::clone(server);
    std::thread::spawn(move || bound.serve(serving));
    socket
}

/// A server over one CPU device of `memory` bytes, served in a fresh folder.
pub fn cpu_server(tag: &str, memory: u64) -> (Arc<Server>, PathBuf, TempDir) {
    let dir = TempDir::new(tag);
    let device = cumux_server::device::cpu::CpuDevice::new(memory);
    let server = Server::new(vec![Arc::new(device) as Arc<dyn Device>]);
    let socket = serve_in(&dir, &server);
    (server, socket, dir)
}

/// The handle of `module`'s kernel `kernel`.
pub fn function(module: &ModuleInfo, kernel: &str) -> Handle {
    module
        .functions
        .iter()
        .find(|f| f.name == kernel)
        .unwrap_or_else(|| panic!("no kernel {kernel}"))
        .handle
}

/// `cuLaunchKernelEx` of `function` on `stream`, with no dynamic shared memory.
pub fn launch_call_on(
    function: Handle,
    grid: [u32; 3],
    block: [u32; 3],
    stream: Handle,
    params: Vec<u8>,
    attributes: Vec<LaunchAttribute>,
) -> Call {
    Call::Launch {
        function,
        grid,
        block,
        shared_bytes: 0,
        stream,
        params,
        attributes,
    }
}

/// `cuLaunchKernel` of `function` on the default stream.
pub fn launch_call(function: Handle, grid: [u32; 3], block: [u32; 3], params: Vec<u8>) -> Call {
    launch_call_on(function, grid, block, DEFAULT_STREAM, params, Vec::new())
}

/// Asserts that every memory call of `c` on `foreign` (another session's
/// pointer, to 16 bytes or more there) is refused as a bad pointer is, by
/// `cuMemAddressRange` too; `own` is 4 bytes or more of `c`'s own.
pub fn assert_foreign_refused(c: &mut Client, foreign: DevicePtr, own: DevicePtr) {
    assert_eq!(c.read(foreign, 4).unwrap_err().code, codes::INVALID_VALUE);
    let refused = [
        Call::MemcpyHtoD {
            dst: foreign,
            data: vec![1; 4],
            stream: None,
        },
        Call::MemcpyDtoD {
            dst: own,
            src: foreign,
            bytes: 4,
            stream: None,
        },
        memset_call(foreign, 0, 1, 4, None),
        memset_call(foreign, 0, 4, 1, None),
        Call::MemFree { ptr: foreign },
    ];
    for call in refused {
        let what = format!("{call:?}");
        assert_eq!(c.code(call), codes::INVALID_VALUE, "{what}");
    }
    for ptr in [foreign, foreign + 8] {
        assert_eq!(c.code(Call::MemAddressRange { ptr }), codes::NOT_FOUND);
    }
}

/// `cuMemsetD8/16/32Async` of `count` elements at `dst`.
pub fn memset_call(
    dst: DevicePtr,
    value: u32,
    elem_bytes: u8,
    count: u64,
    stream: Option<Handle>,
) -> Call {
    Call::Memset {
        dst,
        value,
        elem_bytes,
        count,
        pitch: 0,
        height: 1,
        stream,
    }
}

pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    /// The shared area calls go through, when the server took it.
    shm: Option<Endpoint>,
    seq: u64,
    buf: Vec<u8>,
    pub session: u64,
    pub devices: Vec<DeviceInfo>,
    /// Device printf output received so far.
    pub stdout: Vec<u8>,
}

pub fn hello(version: u32, magic: u32) -> Hello {
    Hello {
        magic,
        version,
        pid: std::process::id(),
        role: ClientRole::Driver,
        program: "test-program".into(),
        tenant: Some("team-a".into()),
        token: None,
        shm: false,
        visible_devices: None,
        join: None,
        resume: None,
        lane: None,
    }
}

pub fn raw_connect(socket: &PathBuf) -> (BufReader<UnixStream>, UnixStream) {
    let s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    (BufReader::new(s.try_clone().unwrap()), s)
}

/// The reply to a driver hello claiming `tenant`.
pub fn hello_as(socket: &PathBuf, tenant: Option<&str>) -> HelloReply {
    let mut h = hello(PROTOCOL_VERSION, MAGIC);
    h.tenant = tenant.map(str::to_string);
    handshake(socket, &h)
}

pub fn handshake(socket: &PathBuf, hello: &Hello) -> HelloReply {
    let (mut r, mut w) = raw_connect(socket);
    write_frame(&mut w, &encode(hello).unwrap()).unwrap();
    let mut buf = Vec::new();
    read_frame(&mut r, &mut buf).unwrap();
    decode(&buf).unwrap()
}

/// Whether test clients offer shared memory: yes unless `CUMUX_TRANSPORT=socket`.
pub fn shm_by_default() -> bool {
    std::env::var("CUMUX_TRANSPORT").map_or(true, |v| v.trim() != "socket")
}

/// Sends the `ShmAttach` frame with `fd` attached, as the client driver does.
pub fn send_attach(writer: &UnixStream, layout: shm::ShmLayout, fd: std::os::fd::BorrowedFd<'_>) {
    let attach = encode(&ShmAttach { layout }).unwrap();
    let mut frame = (attach.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&attach);
    shm::send_with_fd(writer, &frame, fd).unwrap();
}

impl Client {
    pub fn connect(socket: &PathBuf, program: &str, tenant: Option<&str>) -> Self {
        Self::connect_with(socket, program, tenant, shm_by_default())
    }

    /// A client that offers shared memory (`shm`) or keeps to the socket.
    pub fn connect_with(socket: &PathBuf, program: &str, tenant: Option<&str>, shm: bool) -> Self {
        let (mut reader, mut writer) = raw_connect(socket);
        let mut h = hello(PROTOCOL_VERSION, MAGIC);
        h.program = program.into();
        h.tenant = tenant.map(str::to_string);
        h.shm = shm;
        write_frame(&mut writer, &encode(&h).unwrap()).unwrap();
        let mut buf = Vec::new();
        read_frame(&mut reader, &mut buf).unwrap();
        match decode::<HelloReply>(&buf).unwrap() {
            HelloReply::Welcome {
                session,
                devices,
                shm: accepted,
                ..
            } => {
                assert_eq!(accepted, shm, "the server takes shared memory when offered");
                let shm = accepted.then(|| {
                    let (area, fd) = ShmArea::create(shm::DEFAULT_LAYOUT).unwrap();
                    send_attach(&writer, area.layout(), std::os::fd::AsFd::as_fd(&fd));
                    read_frame(&mut reader, &mut buf).unwrap();
                    let answer: ShmAttached = decode(&buf).unwrap();
                    assert_eq!(answer.result, Ok(()));
                    let liveness = writer.try_clone().unwrap();
                    Endpoint::new(area, Side::Client, Some(liveness.into()), shm::DEFAULT_SPIN)
                });
                Client {
                    reader,
                    writer,
                    shm,
                    seq: 0,
                    buf,
                    session,
                    devices,
                    stdout: Vec::new(),
                }
            }
            other => panic!("refused: {other:?}"),
        }
    }

    /// Whether this client's calls go through shared memory.
    pub fn uses_shm(&self) -> bool {
        self.shm.is_some()
    }

    fn send(&mut self, mut call: Call) -> u64 {
        self.seq += 1;
        let seq = self.seq;
        if let Some(ep) = &mut self.shm {
            let bulk = shm::take_call_bulk(&mut call);
            ep.send(&encode(&Request { seq, call }).unwrap(), &bulk)
                .unwrap();
            return seq;
        }
        let bytes = encode(&Request { seq, call }).unwrap();
        write_frame(&mut self.writer, &bytes).unwrap();
        self.writer.flush().unwrap();
        seq
    }

    fn receive(&mut self) -> Reply {
        if let Some(ep) = &mut self.shm {
            let mut bulk = Vec::new();
            ep.recv(&mut self.buf, &mut bulk)
                .expect("the server answers");
            let mut reply: Reply = decode(&self.buf).unwrap();
            shm::put_reply_bulk(&mut reply, bulk).unwrap();
            return reply;
        }
        // Data comes in a bulk frame of its own, as the server sends it.
        read_reply(&mut self.reader, &mut self.buf).expect("the server answers")
    }

    /// Registers `bytes` of pinned host memory at `base`: the call, then
    /// `fd` (if any) with the byte `tag` on the socket, as the client driver
    /// sends a memfd (no fd and tag 0: nothing follows the call).
    pub fn register_host(
        &mut self,
        base: u64,
        bytes: u64,
        fd: Option<std::os::fd::BorrowedFd<'_>>,
        tag: u8,
    ) -> Result<Handle, CuError> {
        self.register_host_as(base, bytes, fd, tag, false)
    }

    /// [`Client::register_host`], asking that the device reach it by `base`.
    pub fn register_host_as(
        &mut self,
        base: u64,
        bytes: u64,
        fd: Option<std::os::fd::BorrowedFd<'_>>,
        tag: u8,
        reached: bool,
    ) -> Result<Handle, CuError> {
        let seq = self.send(Call::HostRegister {
            base,
            bytes,
            reached,
        });
        match fd {
            Some(fd) => shm::send_with_fd(&self.writer, &[tag], fd).unwrap(),
            None if tag == 0 => {}
            None => self.writer.write_all(&[tag]).unwrap(),
        }
        let reply = self.receive();
        assert_eq!(reply.seq, seq);
        reply.result.map(|body| match body {
            ReplyBody::Handle(h) => h,
            other => panic!("{other:?}"),
        })
    }

    /// Sends a fire-and-forget call.
    pub fn post(&mut self, call: Call) {
        assert!(call.is_fire_and_forget(), "{call:?} expects a reply");
        self.send(call);
    }

    /// Makes a replied call.
    pub fn call(&mut self, call: Call) -> Result<ReplyBody, CuError> {
        assert!(!call.is_fire_and_forget(), "{call:?} gets no reply");
        let seq = self.send(call);
        let reply = self.receive();
        assert_eq!(reply.seq, seq);
        self.stdout.extend_from_slice(&reply.stdout);
        reply.result
    }

    pub fn code(&mut self, call: Call) -> u32 {
        match self.call(call) {
            Ok(_) => codes::SUCCESS,
            Err(e) => e.code,
        }
    }

    pub fn alloc(&mut self, bytes: u64) -> DevicePtr {
        match self.call(Call::MemAlloc { device: 0, bytes }).unwrap() {
            ReplyBody::Ptr(p) => p,
            other => panic!("{other:?}"),
        }
    }

    pub fn write(&mut self, dst: DevicePtr, data: &[u8]) {
        self.call(Call::MemcpyHtoD {
            dst,
            data: data.to_vec(),
            stream: None,
        })
        .unwrap();
    }

    pub fn read(&mut self, src: DevicePtr, bytes: u64) -> Result<Vec<u8>, CuError> {
        self.read_on(src, bytes, None)
    }

    pub fn read_on(
        &mut self,
        src: DevicePtr,
        bytes: u64,
        stream: Option<Handle>,
    ) -> Result<Vec<u8>, CuError> {
        match self.call(Call::MemcpyDtoH { src, bytes, stream })? {
            ReplyBody::Data(d) => Ok(d),
            other => panic!("{other:?}"),
        }
    }

    pub fn load(&mut self, image: &str) -> ModuleInfo {
        self.load_bytes(image.as_bytes().to_vec())
    }

    pub fn load_bytes(&mut self, image: Vec<u8>) -> ModuleInfo {
        match self.call(Call::ModuleLoad { image }) {
            Ok(ReplyBody::Module(m)) => m,
            other => panic!("{other:?}"),
        }
    }

    pub fn handle(&mut self, call: Call) -> Handle {
        match self.call(call) {
            Ok(ReplyBody::Handle(h)) => h,
            other => panic!("{other:?}"),
        }
    }

    pub fn stream(&mut self, flags: u32) -> Handle {
        self.handle(Call::StreamCreate { flags, priority: 0 })
    }

    pub fn event(&mut self, flags: u32) -> Handle {
        self.handle(Call::EventCreate { flags })
    }

    /// Launches a model kernel by name.
    pub fn launch(&mut self, module: &ModuleInfo, kernel: &str, stream: Handle, params: Vec<u8>) {
        let function = function(module, kernel);
        let call = launch_call_on(function, [1, 1, 1], [32, 1, 1], stream, params, Vec::new());
        self.post(call);
    }
}

/// Parameters of the model's `scale_add(ptr, mul, add, sleep_ms)`.
pub fn scale_add(ptr: DevicePtr, mul: u32, add: u32, sleep_ms: u32) -> Vec<u8> {
    let mut p = ptr.to_le_bytes().to_vec();
    for v in [mul, add, sleep_ms] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    p
}

pub fn u32_at(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes[..4].try_into().unwrap())
}
