//! A session's dispatch under arbitrary call sequences: a real
//! `cumux_server::session::Session` on a fresh server over the model device
//! (fifo, fair or priority) or the CPU device, fed arbitrary [`calls`] that
//! reuse the handles and pointers it handed out. No call may panic; after the
//! session closes its memory is all released, and a new session on the same
//! server still gets its work done.

use std::sync::Arc;

use arbitrary::{Result, Unstructured};
use cumux_protocol::{
    codes, decode, encode, pinned, Call, ClientRole, CuError, Hello, ReplyBody, Request,
    DEFAULT_STREAM, MAGIC, PROTOCOL_VERSION,
};
use cumux_server::device::cpu::CpuDevice;
use cumux_server::device::model::ModelDevice;
use cumux_server::gate::parse_policy;
use cumux_server::session::Session;
use cumux_server::tenants::{TenantClass, TenantPolicy, TenantSettings};
use cumux_server::{Device, Policy, Server};

use super::calls::{self, Images, Known};
use crate::engine::Target;
use crate::features::Features;
use crate::mutate::Rand;

pub static TARGET: Target = Target {
    name: "session",
    check,
    seeds,
    dictionary: &[],
    max_len: 2048,
};

/// The most calls of one input.
const MAX_CALLS: usize = 48;
/// Device memory of the fuzzed device: small, so allocations and copies stay cheap.
const DEVICE_BYTES: u64 = 16 << 20;
/// Instructions a block of a CPU-device launch may run.
const LAUNCH_BUDGET: u64 = 100_000;

const MODEL_IMAGES: Images = &[
    b"model:scale_add,print,fault,panic;counter:16",
    b"model:print,scale_add",
    b"model:scale_add;g:4096,h:1",
];

/// A kernel that stores each thread's index at `out[tid]` while `tid < n`,
/// and one that loops `n` times (a launch budget to spend).
const PTX: &[u8] = b".version 8.5
.target sm_75
.address_size 64

.visible .entry fill(.param .u64 out, .param .u32 n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %tid.x;
    setp.ge.u32 %p1, %r2, %r1;
    @%p1 exit;
    mul.wide.u32 %rd2, %r2, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r2;
    ret;
}

.visible .entry spin(.param .u32 n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    ld.param.u32 %r1, [n];
    mov.u32 %r2, 0;
LOOP:
    setp.ge.u32 %p1, %r2, %r1;
    @%p1 bra DONE;
    add.u32 %r2, %r2, 1;
    bra LOOP;
DONE:
    ret;
}
";

const CPU_IMAGES: Images = &[
    PTX,
    include_bytes!("../../../fatbin/tests/fixtures/default.fatbin"),
];

/// Which server the input's session runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Model(Policy),
    Cpu,
}

fn hello() -> Hello {
    Hello {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        pid: std::process::id(),
        role: ClientRole::Driver,
        program: "cumux-fuzz".into(),
        tenant: Some("fuzz".into()),
        token: None,
        shm: false,
        visible_devices: None,
        join: None,
        resume: None,
        lane: None,
    }
}

fn open(server: &Arc<Server>, settings: TenantSettings) -> Session {
    Session::open(
        Arc::clone(server),
        &hello(),
        Some(("fuzz".into(), settings)),
    )
    .expect("a session opens on a fresh server")
}

fn check(data: &[u8], features: &mut Features) {
    let mut u = Unstructured::new(data);
    let Ok((backend, settings)) = setup(&mut u) else {
        return;
    };
    features.add(format!("{backend:?}"));
    let (device, images): (Arc<dyn Device>, Images) = match backend {
        Backend::Model(Policy::Fifo) => (Arc::new(ModelDevice::new(DEVICE_BYTES)), MODEL_IMAGES),
        Backend::Model(_) => (Arc::new(ModelDevice::serial(DEVICE_BYTES)), MODEL_IMAGES),
        Backend::Cpu => (
            Arc::new(CpuDevice::with_launch_budget(DEVICE_BYTES, LAUNCH_BUDGET)),
            CPU_IMAGES,
        ),
    };
    let policy = match backend {
        Backend::Model(policy) => policy,
        Backend::Cpu => Policy::Fifo,
    };
    let server = Server::with_policy(vec![Arc::clone(&device)], TenantPolicy::default(), policy);
    let mut session = open(&server, settings.clone());
    let mut known = Known::default();
    // What ran, for the message of a failed check.
    let mut trace = Vec::new();
    let mut previous = "open";
    for _ in 0..MAX_CALLS {
        if u.is_empty() {
            break;
        }
        let Ok(mut call) = calls::call(&mut u, &known, images) else {
            break;
        };
        if matches!(backend, Backend::Model(_)) {
            limit_model_sleeps(&mut call);
        }
        let call = through_the_wire(call);
        if let Call::HostRegister { bytes, .. } = call {
            session.give_fd(memfd_for(&mut u, bytes));
        }
        let kind: &'static str = (&call).into();
        let result = session.handle(call.clone());
        let code = match &result {
            Some(Ok(_)) => codes::SUCCESS,
            Some(Err(e)) => e.code,
            None => u32::MAX,
        };
        // Pairs of calls too, so orders of calls count, not only calls.
        features.add((previous, kind, code));
        previous = kind;
        // At most 200 characters (the call's text may hold any).
        let told: String = format!("{call:?} -> {result:?}")
            .chars()
            .take(200)
            .collect();
        trace.push(told);
        if let Some(result) = &result {
            known.learn(&call, result);
        }
    }
    session.close();
    let trace = trace.join("\n");
    assert_eq!(
        device.mem_used(),
        0,
        "a closed session leaves no memory; on {backend:?}:\n{trace}"
    );
    still_serves(&server, backend, settings);
    assert_eq!(
        device.mem_used(),
        0,
        "a closed session leaves no memory; on {backend:?}:\n{trace}"
    );
}

/// The device, its policy and the tenant's settings.
fn setup(u: &mut Unstructured) -> Result<(Backend, TenantSettings)> {
    let backend = match u.int_in_range(0u8..=5)? {
        0 | 1 => Backend::Model(Policy::Fifo),
        2 => Backend::Model(parse_policy("fair").expect("a policy")),
        3 => Backend::Model(parse_policy("priority").expect("a policy")),
        _ => Backend::Cpu,
    };
    let settings = TenantSettings {
        memory_quota: if u.ratio(1u8, 4)? {
            Some(u.int_in_range(0..=1 << 16)?)
        } else {
            None
        },
        class: if u.arbitrary()? {
            TenantClass::LatencyCritical
        } else {
            TenantClass::Batch
        },
        ..TenantSettings::default()
    };
    Ok((backend, settings))
}

/// The model's `scale_add` sleeps its fourth parameter in milliseconds: a few
/// at most, so an input's time goes to calls rather than to sleeping.
fn limit_model_sleeps(call: &mut Call) {
    let clamp = |params: &mut Vec<u8>| {
        if let Some(sleep) = params.get_mut(16..20) {
            let ms = u32::from_le_bytes([sleep[0], sleep[1], sleep[2], sleep[3]]);
            sleep.copy_from_slice(&(ms % 3).to_le_bytes());
        }
    };
    match call {
        Call::Launch { params, .. } => clamp(params),
        Call::GraphCreate { launches } => launches.iter_mut().for_each(|l| clamp(&mut l.params)),
        _ => {}
    }
}

/// `call` as the server gets it: encoded and decoded, unchanged.
fn through_the_wire(call: Call) -> Call {
    let request = Request { seq: 1, call };
    let bytes = encode(&request).expect("a call encodes");
    let back: Request = decode(&bytes).expect("and decodes");
    assert_eq!(back, request, "a call survives the wire");
    back.call
}

/// The memfd that comes with a `HostRegister`: of its size, of another, or none.
fn memfd_for(
    u: &mut Unstructured,
    bytes: u64,
) -> std::result::Result<std::os::fd::OwnedFd, String> {
    match u.int_in_range(0u8..=3).unwrap_or(0) {
        0 => Err("the fuzzer sent none".into()),
        1 => pinned::create_memfd(bytes / 2 + 1).map_err(|e| e.to_string()),
        _ => pinned::create_memfd(bytes.max(1)).map_err(|e| e.to_string()),
    }
}

/// A new session on `server` gets memory, copies and a synchronize right, and
/// on the model device a kernel's printf.
fn still_serves(server: &Arc<Server>, backend: Backend, settings: TenantSettings) {
    let mut session = open(
        server,
        TenantSettings {
            memory_quota: None,
            ..settings
        },
    );
    let mut call = |call: Call| -> std::result::Result<ReplyBody, CuError> {
        session
            .handle(call)
            .expect("a synchronous call is answered")
    };
    let ptr = match call(Call::MemAlloc {
        device: 0,
        bytes: 64,
    }) {
        Ok(ReplyBody::Ptr(p)) => p,
        other => panic!("a fresh session cannot allocate: {other:?}"),
    };
    let data: Vec<u8> = (0..64).collect();
    call(Call::MemcpyHtoD {
        dst: ptr,
        data: data.clone(),
        stream: None,
    })
    .expect("a copy to the device");
    let back = call(Call::MemcpyDtoH {
        src: ptr,
        bytes: 64,
        stream: None,
    });
    assert_eq!(back, Ok(ReplyBody::Data(data)), "the bytes come back");
    if let Backend::Model(_) = backend {
        let function = match call(Call::ModuleLoad {
            image: b"model:print".to_vec(),
        }) {
            Ok(ReplyBody::Module(m)) => m.functions[0].handle,
            other => panic!("a fresh session cannot load a module: {other:?}"),
        };
        let launch = Call::Launch {
            function,
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_bytes: 0,
            stream: DEFAULT_STREAM,
            params: 7u32.to_le_bytes().to_vec(),
            attributes: Vec::new(),
        };
        assert!(session.handle(launch).is_none(), "a launch is queued");
    }
    let synced = session.handle(Call::ContextSynchronize);
    assert_eq!(
        synced,
        Some(Ok(ReplyBody::Unit)),
        "a fresh session synchronizes"
    );
    if let Backend::Model(_) = backend {
        assert_eq!(session.take_stdout(), b"model 7\n");
    }
    session.close();
}

/// Random inputs, one for each backend at least.
fn seeds() -> Vec<Vec<u8>> {
    let mut rand = Rand::seeded(0x5e55);
    (0..48)
        .map(|i| {
            let mut bytes = vec![0u8; 128 + 16 * i];
            rand.fill(&mut bytes);
            bytes[0] = (i % 6) as u8;
            bytes
        })
        .collect()
}
