//! The checks of a plan that need what it names outside itself: each launch
//! against its kernel (argument count and sizes, geometry within the device's
//! limits) and each call against the function it calls (bindings, types,
//! parameters, no cycle). Refusals name their place, as in `validate`.

use cumux_protocol::launch_checks::LaunchLimits;
use cumux_protocol::FunctionInfo;

use super::expr::{Expr, Value};
use super::validate::{BufferKind, Launch, LaunchArg, Plan};

/// How deep calls may nest (a call of a function that calls …).
pub const MAX_CALL_DEPTH: usize = 4;

/// Bytes of a device address, as a buffer argument passes it.
const ADDRESS_BYTES: u32 = 8;

/// Checks evaluated launch dimensions and dynamic shared memory against the
/// device and the kernel; the error names the place (`launches[0].grid[1]`).
pub fn check_geometry(
    launch: &Launch,
    grid: [u64; 3],
    block: [u64; 3],
    shared: u64,
    kernel: &FunctionInfo,
    limits: &LaunchLimits,
) -> Result<(), String> {
    let path = &launch.path;
    for (field, dims, max) in [("grid", grid, limits.grid), ("block", block, limits.block)] {
        for (i, (d, m)) in dims.iter().zip(max).enumerate() {
            if *d == 0 || *d > m.max(1) as u64 {
                return Err(format!(
                    "{path}.{field}[{i}]: {d} is not within the device's 1..={m}"
                ));
            }
        }
    }
    let threads: u64 = block.iter().product();
    let device_max = limits.threads_per_block.max(1) as u64;
    if threads > device_max {
        return Err(format!(
            "{path}.block: {threads} threads per block, over the device's {device_max}"
        ));
    }
    let kernel_max = kernel.attrs.max_threads_per_block;
    if kernel_max > 0 && threads > kernel_max as u64 {
        return Err(format!(
            "{path}.block: {threads} threads per block, over kernel {:?}'s {kernel_max}",
            kernel.name
        ));
    }
    let total = shared.saturating_add(kernel.attrs.shared_size_bytes.max(0) as u64);
    let optin = limits.shared_per_block_optin.max(0) as u64;
    if total > optin {
        return Err(format!(
            "{path}.shared: {total} bytes of shared memory per block, over the device's {optin}"
        ));
    }
    Ok(())
}

/// Dimensions whose expressions are all constant.
fn constant_dims(dims: &[Expr; 3]) -> Option<Result<[u64; 3], String>> {
    let mut out = [1u64; 3];
    for (slot, e) in out.iter_mut().zip(dims) {
        match e.constant()? {
            Ok(Value::Int(v)) if v >= 0 => *slot = v as u64,
            Ok(other) => return Some(Err(format!("{other} is not a dimension"))),
            Err(why) => return Some(Err(why)),
        }
    }
    Some(Ok(out))
}

/// Checks every launch of `plan` against its kernel, found by `kernel`
/// (the module's kernels by name).
pub fn check_kernels(
    plan: &Plan,
    kernel: &dyn Fn(&str) -> Option<FunctionInfo>,
    names: &[String],
    limits: &LaunchLimits,
) -> Result<(), String> {
    for launch in plan.launches() {
        let path = &launch.path;
        let info = kernel(&launch.kernel).ok_or_else(|| {
            format!(
                "{path}.kernel: the module has no kernel {:?} (it has {})",
                launch.kernel,
                match names.is_empty() {
                    true => "none".to_string(),
                    false => names.join(", "),
                }
            )
        })?;
        if launch.args.len() != info.params.len() {
            return Err(format!(
                "{path}.args: {} arguments for kernel {:?}, which takes {}",
                launch.args.len(),
                launch.kernel,
                info.params.len()
            ));
        }
        for (i, (arg, param)) in launch.args.iter().zip(&info.params).enumerate() {
            let (what, size) = match arg {
                LaunchArg::Buffer(b) => (
                    format!("buffer {:?} is an address of", plan.buffers[*b].name),
                    ADDRESS_BYTES,
                ),
                LaunchArg::Scalar(dtype, _) => {
                    (format!("a {} scalar is", dtype.name()), dtype.size() as u32)
                }
            };
            if size != param.size {
                return Err(format!(
                    "{path}.args[{i}]: size mismatch: {what} {size} bytes, parameter {i} of kernel {:?} has {}",
                    launch.kernel, param.size
                ));
            }
        }
        let grid = constant_dims(&launch.grid);
        let block = constant_dims(&launch.block);
        if let Some(Err(why)) = &grid {
            return Err(format!("{path}.grid: {why}"));
        }
        if let Some(Err(why)) = &block {
            return Err(format!("{path}.block: {why}"));
        }
        // What is known now is checked now; the rest at each invocation.
        let shared = match launch.shared.constant() {
            Some(Ok(Value::Int(v))) if v >= 0 => v as u64,
            Some(Ok(other)) => return Err(format!("{path}.shared: {other} is not a byte count")),
            Some(Err(why)) => return Err(format!("{path}.shared: {why}")),
            None => 0,
        };
        let grid = match grid {
            Some(Ok(g)) => g,
            _ => [1; 3],
        };
        let block = match block {
            Some(Ok(b)) => b,
            _ => [1; 3],
        };
        check_geometry(launch, grid, block, shared, &info, limits)?;
    }
    Ok(())
}

/// Checks every call of `plan` (registered as `name`) against the plans of the
/// functions it calls, found by `callee`; also that no call chain comes back
/// to `name` or nests deeper than [`MAX_CALL_DEPTH`].
pub fn check_calls(
    name: &str,
    plan: &Plan,
    callee: &dyn Fn(&str) -> Option<std::sync::Arc<Plan>>,
) -> Result<(), String> {
    for call in plan.calls() {
        let path = &call.path;
        if call.function == name {
            return Err(format!("{path}.call: a function cannot call itself"));
        }
        let target = callee(&call.function).ok_or_else(|| {
            format!(
                "{path}.call: no function {:?} of this tenant on this device",
                call.function
            )
        })?;
        let bindable: Vec<_> = target
            .buffers
            .iter()
            .filter(|b| b.kind != BufferKind::Scratch)
            .collect();
        for (theirs, ours) in &call.bind {
            let Some(b) = bindable.iter().find(|b| &b.name == theirs) else {
                return Err(format!(
                    "{path}.bind.{theirs}: {:?} has no input or output {theirs:?}",
                    call.function
                ));
            };
            let mine = &plan.buffers[*ours];
            if mine.dtype != b.dtype {
                return Err(format!(
                    "{path}.bind.{theirs}: size mismatch: {:?} takes {}, buffer {:?} is {}",
                    call.function,
                    b.dtype.name(),
                    mine.name,
                    mine.dtype.name()
                ));
            }
        }
        if let Some(b) = bindable
            .iter()
            .find(|b| !call.bind.iter().any(|(n, _)| n == &b.name))
        {
            return Err(format!(
                "{path}.bind: {:?} of {:?} is not bound to a buffer",
                b.name, call.function
            ));
        }
        for (param, _) in &call.params {
            if !target.params.iter().any(|p| &p.name == param) {
                return Err(format!(
                    "{path}.params.{param}: {:?} has no parameter {param:?}",
                    call.function
                ));
            }
        }
        if let Some(p) = target
            .params
            .iter()
            .find(|p| p.default.is_none() && !call.params.iter().any(|(n, _)| n == &p.name))
        {
            return Err(format!(
                "{path}.params: parameter {:?} of {:?} has no default and is not given",
                p.name, call.function
            ));
        }
        let mut chain = vec![name.to_string(), call.function.clone()];
        walk_calls(&target, &mut chain, callee).map_err(|why| format!("{path}.call: {why}"))?;
    }
    Ok(())
}

fn walk_calls(
    plan: &Plan,
    chain: &mut Vec<String>,
    callee: &dyn Fn(&str) -> Option<std::sync::Arc<Plan>>,
) -> Result<(), String> {
    if chain.len() > MAX_CALL_DEPTH + 1 {
        return Err(format!(
            "calls nest more than {MAX_CALL_DEPTH} deep ({})",
            chain.join(" → ")
        ));
    }
    for call in plan.calls() {
        if chain.contains(&call.function) {
            chain.push(call.function.clone());
            return Err(format!("a cycle of calls ({})", chain.join(" → ")));
        }
        if let Some(next) = callee(&call.function) {
            chain.push(call.function.clone());
            walk_calls(&next, chain, callee)?;
            chain.pop();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::model::read;
    use super::super::validate::check;
    use super::*;
    use cumux_protocol::{FunctionAttrs, ParamInfo};
    use std::sync::Arc;

    fn kernel(name: &str, sizes: &[u32]) -> FunctionInfo {
        let mut offset = 0;
        FunctionInfo {
            name: name.into(),
            handle: 1,
            params: sizes
                .iter()
                .map(|&size| {
                    let p = ParamInfo { offset, size };
                    offset += size;
                    p
                })
                .collect(),
            attrs: FunctionAttrs {
                max_threads_per_block: 1024,
                ..FunctionAttrs::default()
            },
        }
    }

    fn plan(launch: &str) -> Plan {
        let json = format!(
            r#"{{"inputs": [{{"name": "a", "dtype": "f32"}}],
                "outputs": [{{"name": "c", "dtype": "f32", "elements": "a"}}],
                "launches": [{launch}]}}"#
        );
        check(&read(json.as_bytes()).unwrap()).unwrap()
    }

    fn linked(launch: &str) -> Result<(), String> {
        let vadd = kernel("vadd", &[8, 8, 4]);
        let names = vec!["vadd".to_string()];
        let limits = LaunchLimits::of(&[]);
        check_kernels(
            &plan(launch),
            &|n| (n == "vadd").then(|| vadd.clone()),
            &names,
            &limits,
        )
    }

    #[test]
    fn launches_are_checked_against_their_kernels() {
        let good = r#"{"kernel": "vadd", "grid": "cdiv(a, 64)", "block": 64,
                       "args": [{"buffer": "a"}, {"buffer": "c"}, {"u32": "a"}]}"#;
        assert_eq!(linked(good), Ok(()));
        let e = linked(&good.replace(r#", {"u32": "a"}"#, "")).unwrap_err();
        assert_eq!(
            e,
            r#"launches[0].args: 2 arguments for kernel "vadd", which takes 3"#
        );
        let e = linked(&good.replace(r#"{"u32": "a"}"#, r#"{"f64": 1}"#)).unwrap_err();
        assert!(
            e.starts_with("launches[0].args[2]: size mismatch: a f64 scalar is 8 bytes"),
            "{e}"
        );
        let e = linked(&good.replace(r#""block": 64"#, r#""block": [64, 2048]"#)).unwrap_err();
        assert!(
            e.starts_with("launches[0].block[1]: 2048 is not within the device's 1..="),
            "{e}"
        );
        let e = linked(&good.replace(r#""cdiv(a, 64)""#, "[1, 70000]")).unwrap_err();
        assert!(
            e.starts_with("launches[0].grid[1]: 70000 is not within"),
            "{e}"
        );
        let e = linked(&good.replace(r#""block": 64"#, r#""block": [64, 32]"#)).unwrap_err();
        assert!(e.contains("2048 threads per block"), "{e}");
        let e = linked(&good.replace("\"vadd\"", "\"vsub\"")).unwrap_err();
        assert_eq!(
            e,
            r#"launches[0].kernel: the module has no kernel "vsub" (it has vadd)"#
        );
    }

    #[test]
    fn calls_are_checked_against_their_callees() {
        let callee = Arc::new(plan(r#"{"kernel": "k", "grid": 1, "block": 1}"#));
        let find = |n: &str| (n == "inner").then(|| Arc::clone(&callee));
        let call = |text: &str| plan(text);
        assert_eq!(
            check_calls(
                "outer",
                &call(r#"{"call": "inner", "bind": {"a": "a", "c": "c"}}"#),
                &find
            ),
            Ok(())
        );
        let e = check_calls(
            "outer",
            &call(r#"{"call": "inner", "bind": {"a": "a"}}"#),
            &find,
        );
        assert_eq!(
            e.unwrap_err(),
            r#"launches[0].bind: "c" of "inner" is not bound to a buffer"#
        );
        let e = check_calls("outer", &call(r#"{"call": "other", "bind": {}}"#), &find);
        assert!(e
            .unwrap_err()
            .starts_with("launches[0].call: no function \"other\""));
        let e = check_calls(
            "inner",
            &call(r#"{"call": "inner", "bind": {"a": "a", "c": "c"}}"#),
            &find,
        );
        assert_eq!(
            e.unwrap_err(),
            "launches[0].call: a function cannot call itself"
        );
        let back = Arc::new(call(r#"{"call": "outer", "bind": {"a": "a", "c": "c"}}"#));
        let e = check_calls(
            "outer",
            &call(r#"{"call": "inner", "bind": {"a": "a", "c": "c"}}"#),
            &|n| (n == "inner").then(|| Arc::clone(&back)),
        );
        assert_eq!(
            e.unwrap_err(),
            "launches[0].call: a cycle of calls (outer → inner → outer)"
        );
    }
}
