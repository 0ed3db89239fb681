//! Function plans and invocation data (`cumux_functions`), all client input
//! of the functions API: any bytes read as a plan, checked against made-up
//! kernels, evaluated for made-up inputs and parameters, and read as JSON or
//! safetensors invocation data give a value or an error, never a panic.

use std::collections::BTreeMap;

use cumux_functions::plan::expr::{Expr, Value};
use cumux_functions::plan::{eval::Env, link, parse, BufferKind};
use cumux_functions::tensors::{read_json, read_safetensors};
use cumux_protocol::launch_checks::LaunchLimits;
use cumux_protocol::{FunctionAttrs, FunctionInfo, ParamInfo};

use crate::engine::Target;
use crate::features::Features;

pub static TARGET: Target = Target {
    name: "plan",
    check,
    seeds,
    dictionary: &[
        b"{\"kernel\": \"k\", \"grid\": 1, \"block\": 1, \"args\": []}",
        b"{\"buffer\": \"a\"}",
        b"{\"u32\": \"a\"}",
        b"{\"f32\": 2.5}",
        b"{\"repeat\": \"n\", \"launches\": []}",
        b"{\"call\": \"f\", \"bind\": {}}",
        b"{\"name\": \"a\", \"dtype\": \"f32\"}",
        b"\"elements\": \"a * 2\"",
        b"cdiv(",
        b"min(",
        b"9223372036854775807",
        b"-",
        b"/ 0",
        b"\"inputs\": ",
        b"\"outputs\": ",
        b"\"scratch\": ",
        b"\"params\": ",
        b"\"launches\": ",
        b"[",
        b"]",
        b"{",
        b"}",
        b",",
    ],
    max_len: 4096,
};

/// A kernel `k` of `n` 4- or 8-byte parameters.
fn kernel(name: &str, sizes: &[u32]) -> FunctionInfo {
    let mut offset: u32 = 0;
    let params = sizes
        .iter()
        .map(|&size| {
            offset = offset.next_multiple_of(size);
            let p = ParamInfo { offset, size };
            offset += size;
            p
        })
        .collect();
    FunctionInfo {
        name: name.into(),
        handle: 1,
        params,
        attrs: FunctionAttrs {
            max_threads_per_block: 1024,
            ..FunctionAttrs::default()
        },
    }
}

fn check(data: &[u8], features: &mut Features) {
    if let Ok(text) = std::str::from_utf8(data) {
        for line in text.lines().take(16) {
            match Expr::parse(line) {
                Ok(e) => {
                    let v = e.eval(&|_| Some(Value::Int(7)));
                    features.add(("expr", v.is_ok()));
                }
                Err(why) => features.add_message("expr refused", &why),
            }
        }
    }
    let _ = read_json(data, &|_| Some(cumux_functions::plan::DType::F32));
    let _ = read_safetensors(data);
    let plan = match parse(data) {
        Ok(plan) => plan,
        Err(why) => {
            features.add_message("refused", &why);
            return;
        }
    };
    features.add(("buffers", plan.buffers.len().min(8)));
    let kernels = [kernel("k", &[8, 8, 4]), kernel("s", &[8, 4, 4, 8])];
    let names: Vec<String> = kernels.iter().map(|k| k.name.clone()).collect();
    let find = |n: &str| kernels.iter().find(|k| k.name == n).cloned();
    let limits = LaunchLimits::of(&[]);
    let linked = link::check_kernels(&plan, &find, &names, &limits);
    features.add(("linked", linked.is_ok()));
    let called = link::check_calls("me", &plan, &|_| Some(std::sync::Arc::new(plan.clone())));
    features.add(("calls", called.is_ok()));
    for size in [0u64, 1, 1000] {
        // Each input of the rank its plan declares (one dimension if none).
        let inputs: BTreeMap<String, Vec<u64>> = plan
            .of_kind(BufferKind::Input)
            .map(|(_, b)| {
                let rank = b.shape.as_ref().map_or(1, Vec::len);
                (b.name.clone(), vec![size; rank])
            })
            .collect();
        let params: BTreeMap<String, Value> = plan
            .params
            .iter()
            .map(|p| (p.name.clone(), Value::Int(size as i64)))
            .collect();
        let Ok(env) = Env::new(&plan, &inputs, &params) else {
            continue;
        };
        let addresses: Vec<u64> = (0..plan.buffers.len() as u64)
            .map(|i| 0x1000 * (i + 1))
            .collect();
        for launch in plan.launches() {
            if let Ok((grid, block, shared)) = env.shape(launch) {
                if let Some(k) = find(&launch.kernel) {
                    let fits = link::check_geometry(launch, grid, block, shared, &k, &limits);
                    features.add(("geometry", fits.is_ok()));
                    let packed = env.pack(launch, &addresses, &k);
                    features.add(("packed", packed.is_ok()));
                }
            }
        }
    }
}

/// Plans of the docs and the tests.
fn seeds() -> Vec<Vec<u8>> {
    [
        r#"{"inputs": [{"name": "x", "dtype": "f32", "shape": [null, "k"]},
                       {"name": "w", "dtype": "f32", "shape": ["x.shape[-1]", "n"]}],
            "params": [{"name": "k", "dtype": "u32", "default": 1000}, {"name": "n", "dtype": "u32", "default": 2}],
            "outputs": [{"name": "y", "dtype": "f32", "shape": ["x.shape[0]", "w.shape[1]"]}],
            "launches": [{"kernel": "k", "grid": ["cdiv(x.shape[0], 64)", "n"], "block": 64,
                          "args": [{"buffer": "x"}, {"buffer": "y"}, {"u32": "w.shape[0]"}]}]}"#,
        r#"{"inputs": [{"name": "a", "dtype": "f32"}, {"name": "b", "dtype": "f32", "elements": "a"}],
            "params": [{"name": "n", "dtype": "u32", "default": 2}],
            "outputs": [{"name": "c", "dtype": "f32", "elements": "a"}],
            "scratch": [{"name": "t", "dtype": "f32", "elements": "a * 2"}],
            "launches": [
              {"kernel": "k", "grid": "cdiv(a, 64)", "block": [64, 1], "shared": "n * 4",
               "args": [{"buffer": "a"}, {"buffer": "c"}, {"u32": "a"}]},
              {"repeat": "n", "launches": [
                {"kernel": "s", "grid": 1, "block": 32,
                 "args": [{"buffer": "t"}, {"f32": 2.5}, {"u32": "n"}, {"buffer": "b"}]}]},
              {"call": "me2", "bind": {"x": "c"}, "params": {"k": "n - 1"}}]}"#,
        r#"{"outputs": [{"name": "x", "dtype": "u8", "elements": 4}],
            "launches": [{"kernel": "k", "grid": [1, 70000], "block": 1, "args": []}]}"#,
        r#"{"inputs": {"a": [1, 2, 3], "b": {"dtype": "i32", "shape": [1, 2], "data": [-1, 7]}}, "params": {"k": 3}}"#,
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}
