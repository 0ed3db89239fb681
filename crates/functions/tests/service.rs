//! `Functions` without HTTP, on an in-process CPU device under the `fair`
//! policy: invocations are ordinary server sessions (status, the gate, the
//! tenant's counters), tenants run side by side with right results, a
//! lane's bounded queue turns the surplus away, and a buffer the lane pools
//! shows no later invocation what an earlier one left in it.

use std::sync::Arc;
use std::time::Duration;

use cumux_functions::tensors::{Request, Tensor};
use cumux_functions::{Failure, Functions, Limits, Placement};
use cumux_server::device::backends::numbered_cpu_device;
use cumux_server::status::StatusScope;
use cumux_server::tenants::{TenantPolicy, TenantSettings};
use cumux_server::Server;
use serde_json::json;

fn ptx() -> Vec<u8> {
    let root =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/functions/kernels.ptx");
    std::fs::read(root).expect("the test kernels")
}

fn service() -> (Arc<Server>, Arc<Functions>) {
    service_with(Limits::default())
}

/// [`service`] with `limits`.
fn service_with(limits: Limits) -> (Arc<Server>, Arc<Functions>) {
    let spec = cumux_server::device::backends::CpuSpec {
        memory: 256 << 20,
        launch_budget: 0,
        threads: 0,
    };
    let device = numbered_cpu_device(0, &spec).unwrap();
    let mut tenants = TenantPolicy::default();
    for name in ["a", "b"] {
        let settings = TenantSettings {
            token: Some(format!("{name}-token-0123456789abcdef")),
            ..TenantSettings::default()
        };
        tenants.tenants.insert(name.into(), settings);
    }
    let policy = cumux_server::gate::parse_policy("fair").unwrap();
    let server = Server::with_policy(vec![device], tenants, policy);
    let functions = Arc::new(Functions::new(Arc::clone(&server), limits));
    (server, functions)
}

fn tenant(f: &Functions, name: &str) -> (String, TenantSettings) {
    f.authenticate(Some(&format!("{name}-token-0123456789abcdef")))
        .unwrap()
}

fn floats(values: &[f32]) -> Tensor {
    Tensor {
        dtype: cumux_functions::plan::DType::F32,
        shape: vec![values.len() as u64],
        data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

fn vadd() -> serde_json::Value {
    json!({
        "inputs": [{"name": "a", "dtype": "f32"}, {"name": "b", "dtype": "f32", "elements": "a"}],
        "outputs": [{"name": "c", "dtype": "f32", "elements": "a"}],
        "launches": [{"kernel": "vadd", "grid": "cdiv(a, 32)", "block": 32,
                      "args": [{"buffer": "a"}, {"buffer": "b"}, {"buffer": "c"}, {"u32": "a"}]}]
    })
}

#[test]
fn tenants_invoke_side_by_side_through_their_own_sessions() {
    let (server, f) = service();
    for name in ["a", "b"] {
        f.register(
            &tenant(&f, name),
            "vadd",
            Placement::Cpu,
            ptx(),
            vadd(),
            vec![],
        )
        .map(|_| ())
        .or_else(|e| match (name, e) {
            // Function names are the server's: b cannot take a's.
            ("b", Failure::Forbidden(_)) => f
                .register(
                    &tenant(&f, "b"),
                    "vadd_b",
                    Placement::Cpu,
                    ptx(),
                    vadd(),
                    vec![],
                )
                .map(|_| ()),
            (_, e) => Err(e),
        })
        .unwrap();
    }
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let f = Arc::clone(&f);
            std::thread::spawn(move || {
                let (who, name) = if i % 2 == 0 {
                    ("a", "vadd")
                } else {
                    ("b", "vadd_b")
                };
                let t = tenant(&f, who);
                for round in 0..5 {
                    let n = 50 + i * 10 + round;
                    let a: Vec<f32> = (0..n).map(|x| x as f32).collect();
                    let b: Vec<f32> = (0..n).map(|x| (x * i) as f32).collect();
                    let request = Request {
                        tensors: [("a".to_string(), floats(&a)), ("b".to_string(), floats(&b))]
                            .into(),
                        params: Default::default(),
                    };
                    let out = f.invoke(&t, name, request, None).unwrap();
                    let c = &out["c"];
                    assert_eq!(c.shape, [n as u64]);
                    let last = f32::from_le_bytes(c.data[c.data.len() - 4..].try_into().unwrap());
                    assert_eq!(last, ((n - 1) * (i + 1)) as f32);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // Each tenant's lanes are sessions of the server, counted as any other:
    // its four threads' 20 invocations ran on one to four of them.
    let status = cumux_server::server_status(&server, &StatusScope::Everything);
    for who in ["a", "b"] {
        let program = format!("cumux-functions ({who})");
        let lanes: Vec<_> = status
            .sessions
            .iter()
            .filter(|s| s.program == program)
            .collect();
        assert!(
            (1..=cumux_functions::service::DEFAULT_LANES_PER_DEVICE).contains(&lanes.len()),
            "{lanes:?}"
        );
        assert_eq!(
            lanes.iter().map(|s| s.launches).sum::<u64>(),
            20,
            "{lanes:?}"
        );
    }
    assert_eq!(
        status.sessions.len(),
        status
            .sessions
            .iter()
            .filter(|s| s.program.starts_with("cumux-functions ("))
            .count()
    );
}

#[test]
fn a_full_lane_turns_the_surplus_away() {
    // One lane: every invocation queues behind the running one.
    let (_server, f) = service_with(Limits {
        lanes_per_device: 1,
        ..Limits::default()
    });
    let t = tenant(&f, "a");
    let spin = json!({
        "outputs": [{"name": "x", "dtype": "f32", "elements": 1}],
        "launches": [{"kernel": "spin", "grid": 1, "block": 1, "args": [{"buffer": "x"}]}]
    });
    f.register(&t, "spin", Placement::Auto, ptx(), spin, vec![])
        .unwrap();
    let threads: Vec<_> = (0..cumux_functions::lane::MAX_QUEUED + 8)
        .map(|_| {
            let f = Arc::clone(&f);
            let t = t.clone();
            std::thread::spawn(move || {
                f.invoke(
                    &t,
                    "spin",
                    Request::default(),
                    Some(Duration::from_millis(1500)),
                )
                .unwrap_err()
            })
        })
        .collect();
    let failures: Vec<Failure> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let busy = failures
        .iter()
        .filter(|e| matches!(e, Failure::Busy(_)))
        .count();
    let late = failures
        .iter()
        .filter(|e| matches!(e, Failure::Deadline(_)))
        .count();
    assert!(busy >= 1, "{failures:?}");
    assert_eq!(busy + late, failures.len(), "{failures:?}");
}

#[test]
fn a_queued_invocations_deadline_leaves_the_running_one_alone() {
    // One lane: every invocation queues behind the running one.
    let (_server, f) = service_with(Limits {
        lanes_per_device: 1,
        ..Limits::default()
    });
    let t = tenant(&f, "a");
    let busy = json!({
        "params": [{"name": "n", "dtype": "u32"}],
        "outputs": [{"name": "x", "dtype": "f32", "elements": 1}],
        "launches": [{"kernel": "busy", "grid": 1, "block": 1, "args": [{"buffer": "x"}, {"u32": "n"}]}]
    });
    f.register(&t, "busy", Placement::Cpu, ptx(), busy, vec![])
        .unwrap();
    let request = |n: u32| Request {
        tensors: Default::default(),
        params: [("n".to_string(), json!(n))].into(),
    };
    // How long a million turns take here (the fastest of three runs), to
    // make the first run (about 1.5 s) outlast the second's deadline.
    let per_million = (0..3)
        .map(|_| {
            let started = std::time::Instant::now();
            f.invoke(&t, "busy", request(2_000_000), None).unwrap();
            started.elapsed().as_secs_f64() / 2.0
        })
        .fold(f64::INFINITY, f64::min)
        .max(1e-4);
    let turns = (1.5 / per_million * 1e6).min(4e9) as u32;
    let long = {
        let (f, t) = (Arc::clone(&f), t.clone());
        std::thread::spawn(move || f.invoke(&t, "busy", request(turns), None))
    };
    std::thread::sleep(Duration::from_millis(50));
    let short = f.invoke(&t, "busy", request(turns), Some(Duration::from_millis(150)));
    assert!(matches!(short, Err(Failure::Deadline(_))), "{short:?}");
    let out = long.join().unwrap().unwrap();
    let x = f32::from_le_bytes(out["x"].data[..4].try_into().unwrap());
    assert_eq!(x, turns as f32);
}

/// The f32 values of output `name` of `out`.
fn values(out: &std::collections::BTreeMap<String, Tensor>, name: &str) -> Vec<f32> {
    out[name]
        .data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

#[test]
fn a_pooled_buffer_comes_back_all_zeros() {
    let (_server, f) = service();
    let t = tenant(&f, "a");
    // Fills every byte of an output of each size class and of a scratch
    // buffer with 7s; the lane pools them when it is done.
    let dirty = json!({
        "outputs": [{"name": "big", "dtype": "f32", "elements": 1024},
                    {"name": "small", "dtype": "f32", "elements": 64}],
        "scratch": [{"name": "t", "dtype": "f32", "elements": 1024}],
        "launches": [
            {"kernel": "fill", "grid": 16, "block": 64, "args": [{"buffer": "big"}, {"f32": 7}, {"u32": 1024}]},
            {"kernel": "fill", "grid": 1, "block": 64, "args": [{"buffer": "small"}, {"f32": 7}, {"u32": 64}]},
            {"kernel": "fill", "grid": 16, "block": 64, "args": [{"buffer": "t"}, {"f32": 7}, {"u32": 1024}]}
        ]
    });
    // Reads what it was given of the same classes without writing it: the
    // input's allocation past its 8 values, a scratch buffer, and an output
    // no kernel writes.
    let peek = json!({
        "inputs": [{"name": "a", "dtype": "f32"}],
        "outputs": [{"name": "tail", "dtype": "f32", "elements": 64},
                    {"name": "seen", "dtype": "f32", "elements": 1024},
                    {"name": "untouched", "dtype": "f32", "elements": 1024}],
        "scratch": [{"name": "t", "dtype": "f32", "elements": 1024}],
        "launches": [
            {"kernel": "copy", "grid": 1, "block": 64, "args": [{"buffer": "a"}, {"buffer": "tail"}, {"u32": 64}]},
            {"kernel": "copy", "grid": 16, "block": 64, "args": [{"buffer": "t"}, {"buffer": "seen"}, {"u32": 1024}]}
        ]
    });
    f.register(&t, "dirty", Placement::Cpu, ptx(), dirty, vec![])
        .unwrap();
    f.register(&t, "peek", Placement::Cpu, ptx(), peek, vec![])
        .unwrap();
    let input: Vec<f32> = (1..=8).map(|v| v as f32).collect();
    for _ in 0..3 {
        let out = f.invoke(&t, "dirty", Request::default(), None).unwrap();
        assert!(values(&out, "big").iter().all(|v| *v == 7.0));
        assert!(values(&out, "small").iter().all(|v| *v == 7.0));
        let request = Request {
            tensors: [("a".to_string(), floats(&input))].into(),
            params: Default::default(),
        };
        let out = f.invoke(&t, "peek", request, None).unwrap();
        let tail = values(&out, "tail");
        assert_eq!(tail[..8], input[..], "{tail:?}");
        assert!(tail[8..].iter().all(|v| *v == 0.0), "{tail:?}");
        for name in ["seen", "untouched"] {
            let seen = values(&out, name);
            assert!(seen.iter().all(|v| *v == 0.0), "{name}: {seen:?}");
        }
    }
}
