//! A plan evaluated for one invocation: the names' values (inputs' sizes,
//! parameters), every buffer's size, each launch's geometry and its packed
//! arguments. Errors name their place, as registration's do.

use std::collections::{BTreeMap, HashMap};

use cumux_protocol::launch_checks::params_bytes;
use cumux_protocol::FunctionInfo;

use super::expr::{count, Expr, Value};
use super::validate::{BufferKind, Launch, LaunchArg, Plan};

/// Most elements one buffer may have.
pub const MAX_ELEMENTS: i64 = 1 << 40;

/// The values of one invocation's names and its buffers' sizes.
#[derive(Debug, Clone)]
pub struct Env {
    /// Elements of each buffer, in [`Plan::buffers`] order.
    pub elements: Vec<u64>,
    values: HashMap<String, Value>,
}

impl Env {
    /// The environment of `plan` given its inputs' element counts and the
    /// parameters given (defaults fill the rest). `what` prefixes errors about
    /// what the caller gave (`inputs`, or a call's path).
    pub fn new(
        plan: &Plan,
        inputs: &BTreeMap<String, u64>,
        params: &BTreeMap<String, Value>,
    ) -> Result<Env, String> {
        let mut values = HashMap::new();
        for (name, value) in params {
            let p = plan
                .params
                .iter()
                .find(|p| &p.name == name)
                .ok_or_else(|| format!("params.{name}: the function has no parameter {name:?}"))?;
            p.dtype
                .encode(*value)
                .map_err(|why| format!("params.{name}: {why}"))?;
            values.insert(name.clone(), *value);
        }
        for p in &plan.params {
            if !values.contains_key(&p.name) {
                let value = p.default.ok_or_else(|| {
                    format!(
                        "params.{}: missing (a {} with no default)",
                        p.name,
                        p.dtype.name()
                    )
                })?;
                values.insert(p.name.clone(), value);
            }
        }
        if let Some(name) = inputs.keys().find(|n| {
            !plan
                .buffers
                .iter()
                .any(|b| &b.name == *n && b.kind == BufferKind::Input)
        }) {
            return Err(format!("inputs.{name}: the function has no input {name:?}"));
        }
        let mut elements = vec![0; plan.buffers.len()];
        for (i, b) in plan.of_kind(BufferKind::Input) {
            let n = *inputs
                .get(&b.name)
                .ok_or_else(|| format!("inputs.{}: missing", b.name))?;
            elements[i] = n;
            values.insert(b.name.clone(), Value::Int(n as i64));
        }
        let mut env = Env { elements, values };
        for (i, b) in plan.buffers.iter().enumerate() {
            let Some(e) = &b.elements else { continue };
            let path = format!("{}.elements", b.path);
            let want = count(env.eval(&path, e)?, 0, MAX_ELEMENTS)
                .map_err(|why| format!("{path}: {why}"))?;
            match b.kind {
                BufferKind::Input if want != env.elements[i] => {
                    return Err(format!(
                    "{path}: size mismatch: input {:?} has {} elements, the plan says {e} = {want}",
                    b.name, env.elements[i]
                ))
                }
                BufferKind::Input => {}
                _ => env.elements[i] = want,
            }
        }
        Ok(env)
    }

    pub fn lookup(&self, name: &str) -> Option<Value> {
        self.values.get(name).copied()
    }

    /// `e`'s value; an error is placed at `path`.
    pub fn eval(&self, path: &str, e: &Expr) -> Result<Value, String> {
        e.eval(&|n| self.lookup(n))
            .map_err(|why| format!("{path}: {why}"))
    }

    /// `e`'s value as a count within `min..=max`.
    pub fn count(&self, path: &str, e: &Expr, min: i64, max: i64) -> Result<u64, String> {
        count(self.eval(path, e)?, min, max).map_err(|why| format!("{path}: {why}"))
    }

    /// A launch's grid, block and dynamic shared bytes (range-checked by
    /// [`super::link::check_geometry`] after).
    pub fn shape(&self, launch: &Launch) -> Result<([u64; 3], [u64; 3], u64), String> {
        let dims = |field: &str, exprs: &[Expr; 3]| -> Result<[u64; 3], String> {
            let mut out = [1u64; 3];
            for (i, (slot, e)) in out.iter_mut().zip(exprs).enumerate() {
                *slot = self.count(
                    &format!("{}.{field}[{i}]", launch.path),
                    e,
                    0,
                    i64::from(u32::MAX),
                )?;
            }
            Ok(out)
        };
        let grid = dims("grid", &launch.grid)?;
        let block = dims("block", &launch.block)?;
        let shared = self.count(
            &format!("{}.shared", launch.path),
            &launch.shared,
            0,
            i64::from(u32::MAX),
        )?;
        Ok((grid, block, shared))
    }

    /// The launch's arguments packed as `kernel` takes them: each buffer's
    /// device address (`addresses`, by buffer index), each scalar's bytes.
    pub fn pack(
        &self,
        launch: &Launch,
        addresses: &[u64],
        kernel: &FunctionInfo,
    ) -> Result<Vec<u8>, String> {
        if launch.args.len() != kernel.params.len() {
            return Err(format!(
                "{}.args: {} arguments for kernel {:?}, which takes {}",
                launch.path,
                launch.args.len(),
                kernel.name,
                kernel.params.len()
            ));
        }
        let mut packed = vec![0u8; params_bytes(&kernel.params) as usize];
        for (i, (arg, param)) in launch.args.iter().zip(&kernel.params).enumerate() {
            let path = format!("{}.args[{i}]", launch.path);
            let bytes = match arg {
                LaunchArg::Buffer(b) => addresses
                    .get(*b)
                    .ok_or_else(|| format!("{path}: no address for the buffer"))?
                    .to_le_bytes()
                    .to_vec(),
                LaunchArg::Scalar(dtype, e) => dtype
                    .encode(self.eval(&path, e)?)
                    .map_err(|why| format!("{path}: {why}"))?,
            };
            let start = param.offset as usize;
            let slot = packed
                .get_mut(start..start + bytes.len())
                .filter(|_| bytes.len() == param.size as usize)
                .ok_or_else(|| {
                    format!(
                        "{path}: size mismatch with parameter {i} of {:?}",
                        kernel.name
                    )
                })?;
            slot.copy_from_slice(&bytes);
        }
        Ok(packed)
    }
}

#[cfg(test)]
mod tests {
    use super::super::model::read;
    use super::super::validate::check;
    use super::*;

    fn plan() -> Plan {
        let json = r#"{
            "inputs": [{"name": "a", "dtype": "f32"}, {"name": "b", "dtype": "f32", "elements": "a"}],
            "params": [{"name": "k", "dtype": "f32"}, {"name": "n", "dtype": "u32", "default": 3}],
            "outputs": [{"name": "c", "dtype": "f32", "elements": "a + n"}],
            "launches": [{"kernel": "x", "grid": "cdiv(a, 2)", "block": [2, 1], "shared": "n * 4",
                          "args": [{"buffer": "c"}, {"f32": "k"}, {"u32": "a"}]}]
        }"#;
        check(&read(json.as_bytes()).unwrap()).unwrap()
    }

    fn inputs(a: u64, b: u64) -> BTreeMap<String, u64> {
        BTreeMap::from([("a".into(), a), ("b".into(), b)])
    }

    #[test]
    fn sizes_geometry_and_arguments_come_from_inputs_and_parameters() {
        let plan = plan();
        let params = BTreeMap::from([("k".to_string(), Value::Float(2.0))]);
        let env = Env::new(&plan, &inputs(5, 5), &params).unwrap();
        assert_eq!(env.elements, [5, 5, 8]);
        let launch = plan.launches()[0];
        assert_eq!(env.shape(launch), Ok(([3, 1, 1], [2, 1, 1], 12)));
        let kernel = FunctionInfo {
            name: "x".into(),
            handle: 1,
            params: vec![
                cumux_protocol::ParamInfo { offset: 0, size: 8 },
                cumux_protocol::ParamInfo { offset: 8, size: 4 },
                cumux_protocol::ParamInfo {
                    offset: 12,
                    size: 4,
                },
            ],
            attrs: Default::default(),
        };
        let packed = env.pack(launch, &[0, 0, 0x1000], &kernel).unwrap();
        assert_eq!(&packed[..8], &0x1000u64.to_le_bytes());
        assert_eq!(&packed[8..12], &2f32.to_le_bytes());
        assert_eq!(&packed[12..], &5u32.to_le_bytes());
    }

    #[test]
    fn what_the_caller_gives_is_checked_with_its_place() {
        let plan = plan();
        let k = BTreeMap::from([("k".to_string(), Value::Float(2.0))]);
        let e = Env::new(&plan, &inputs(5, 4), &k).unwrap_err();
        assert_eq!(
            e,
            r#"inputs[1].elements: size mismatch: input "b" has 4 elements, the plan says a = 5"#
        );
        assert_eq!(
            Env::new(&plan, &inputs(5, 5), &BTreeMap::new()).unwrap_err(),
            "params.k: missing (a f32 with no default)"
        );
        let mut extra = inputs(5, 5);
        extra.insert("z".into(), 1);
        assert_eq!(
            Env::new(&plan, &extra, &k).unwrap_err(),
            r#"inputs.z: the function has no input "z""#
        );
        let bad_n = BTreeMap::from([
            ("k".to_string(), Value::Float(1.0)),
            ("n".to_string(), Value::Int(-1)),
        ]);
        assert_eq!(
            Env::new(&plan, &inputs(5, 5), &bad_n).unwrap_err(),
            "params.n: -1 does not fit u32"
        );
    }
}
