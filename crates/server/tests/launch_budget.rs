//! A tenant's kernel that never ends on the CPU device: with a per-block
//! instruction budget the launch fails with CUDA_ERROR_LAUNCH_TIMEOUT (702),
//! like the driver's watchdog. The fault is sticky for that session, and the
//! server keeps serving other sessions.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use cumux_protocol::*;
use cumux_server::device::cpu::CpuDevice;
use cumux_server::{listener, Address, Device, Server};

/// `spin()`: loops forever; `store(dst)`: `*dst = 42`.
const PTX: &str = r#"
.version 8.0
.target sm_75
.address_size 64

.visible .entry spin()
{
$L_spin:
    bra $L_spin;
}

.visible .entry store(.param .u64 dst)
{
    .reg .b64 %rd<3>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd1, [dst];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u32 %r1, 42;
    st.global.u32 [%rd2], %r1;
    ret;
}
"#;

fn launch(c: &mut Client, m: &ModuleInfo, kernel: &str, grid: u32, params: Vec<u8>) {
    c.post(launch_call(
        function(m, kernel),
        [grid, 1, 1],
        [32, 1, 1],
        params,
    ));
}

fn store(c: &mut Client) -> u32 {
    let m = c.load(PTX);
    let out = c.alloc(4);
    launch(c, &m, "store", 1, out.to_le_bytes().to_vec());
    assert_eq!(c.code(Call::ContextSynchronize), codes::SUCCESS);
    u32_at(&c.read(out, 4).unwrap())
}

#[test]
fn a_kernel_that_never_ends_times_out_and_the_server_keeps_serving() {
    let dir = TempDir::new("launch-budget");
    let socket = dir.0.join("s.sock");
    let device = CpuDevice::with_launch_budget(64 << 20, 1_000_000);
    let server = Server::new(vec![Arc::new(device) as Arc<dyn Device>]);
    let bound = listener::bind(&Address::Unix(socket.clone())).unwrap();
    let serving = Arc::clone(&server);
    std::thread::spawn(move || bound.serve(serving));

    // A normal kernel runs well within the budget.
    let mut before = Client::connect(&socket, "before", None);
    assert_eq!(store(&mut before), 42);

    let mut spinner = Client::connect(&socket, "spinner", None);
    let m = spinner.load(PTX);
    let started = Instant::now();
    launch(&mut spinner, &m, "spin", 4, Vec::new());
    assert_eq!(
        spinner.code(Call::ContextSynchronize),
        codes::LAUNCH_TIMEOUT
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the timeout took {:?}",
        started.elapsed()
    );
    // Sticky for that session, like the driver's watchdog.
    assert_eq!(
        spinner.code(Call::ContextSynchronize),
        codes::LAUNCH_TIMEOUT
    );
    assert_eq!(
        spinner
            .call(Call::MemAlloc {
                device: 0,
                bytes: 4
            })
            .unwrap_err()
            .code,
        codes::LAUNCH_TIMEOUT
    );

    // Other sessions, old and new, keep running kernels.
    assert_eq!(store(&mut before), 42);
    let mut after = Client::connect(&socket, "after", None);
    assert_eq!(store(&mut after), 42);
}
