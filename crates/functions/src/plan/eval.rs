//! A plan evaluated for one invocation: the names' values (inputs' sizes and
//! shapes, parameters), every buffer's size and shape (an input's checked
//! against what the plan says of it), each launch's geometry and its packed
//! arguments. Errors name their place, as registration's do.

use std::collections::{BTreeMap, HashMap};

use cumux_protocol::launch_checks::params_bytes;
use cumux_protocol::FunctionInfo;

use super::expr::{count, Expr, Scope, Value};
use super::validate::{BufferKind, Launch, LaunchArg, Plan};

/// Most elements one buffer may have.
pub const MAX_ELEMENTS: i64 = 1 << 40;

/// The values of one invocation's names and its buffers' sizes and shapes.
#[derive(Debug, Clone)]
pub struct Env {
    /// Elements of each buffer, in [`Plan::buffers`] order.
    pub elements: Vec<u64>,
    /// Shape of each buffer, in [`Plan::buffers`] order (one dimension, its
    /// elements, for a buffer sized by `elements`).
    pub shapes: Vec<Vec<u64>>,
    values: HashMap<String, Value>,
    /// Each input's name and buffer index, for its dimensions.
    inputs: Vec<(String, usize)>,
}

/// The elements of `shape`, if they do not overflow.
fn product(shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |n, d| n.checked_mul(*d))
}

impl Env {
    /// The environment of `plan` given its inputs' shapes and the parameters
    /// given (defaults fill the rest); each input checked against the size
    /// or shape the plan says it has.
    pub fn new(
        plan: &Plan,
        inputs: &BTreeMap<String, Vec<u64>>,
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
        let mut shapes = vec![Vec::new(); plan.buffers.len()];
        let mut names = Vec::new();
        for (i, b) in plan.of_kind(BufferKind::Input) {
            let shape = inputs
                .get(&b.name)
                .ok_or_else(|| format!("inputs.{}: missing", b.name))?;
            let n = product(shape)
                .filter(|n| *n <= MAX_ELEMENTS as u64)
                .ok_or_else(|| format!("inputs.{}: shape {shape:?} is too large", b.name))?;
            elements[i] = n;
            shapes[i] = shape.clone();
            values.insert(b.name.clone(), Value::Int(n as i64));
            names.push((b.name.clone(), i));
        }
        let mut env = Env {
            elements,
            shapes,
            values,
            inputs: names,
        };
        for (i, b) in plan.buffers.iter().enumerate() {
            if let Some(e) = &b.elements {
                let path = format!("{}.elements", b.path);
                let want = env.count(&path, e, 0, MAX_ELEMENTS)?;
                match b.kind {
                    BufferKind::Input if want != env.elements[i] => {
                        return Err(format!(
                            "{path}: size mismatch: input {:?} has {} elements, the plan says {e} = {want}",
                            b.name, env.elements[i]
                        ))
                    }
                    BufferKind::Input => {}
                    _ => {
                        env.elements[i] = want;
                        env.shapes[i] = vec![want];
                    }
                }
            }
            if let Some(dims) = &b.shape {
                let path = format!("{}.shape", b.path);
                match b.kind {
                    BufferKind::Input => env.check_input(b, i, dims)?,
                    _ => {
                        let mut shape = Vec::with_capacity(dims.len());
                        for (d, e) in dims.iter().enumerate() {
                            let e = e.as_ref().ok_or_else(|| format!("{path}[{d}]: missing"))?;
                            shape.push(env.count(&format!("{path}[{d}]"), e, 0, MAX_ELEMENTS)?);
                        }
                        env.elements[i] = product(&shape)
                            .filter(|n| *n <= MAX_ELEMENTS as u64)
                            .ok_or_else(|| {
                                format!("{path}: {shape:?} is over {MAX_ELEMENTS} elements")
                            })?;
                        env.shapes[i] = shape;
                    }
                }
            }
        }
        Ok(env)
    }

    /// Checks input `b` (buffer `i`) against the shape the plan says it has.
    fn check_input(
        &self,
        b: &super::validate::Buffer,
        i: usize,
        dims: &[Option<Expr>],
    ) -> Result<(), String> {
        let path = format!("{}.shape", b.path);
        let given = &self.shapes[i];
        if given.len() != dims.len() {
            return Err(format!(
                "{path}: input {:?} has {} dimensions {given:?}, the plan says {}",
                b.name,
                given.len(),
                dims.len()
            ));
        }
        for (d, (e, has)) in dims.iter().zip(given).enumerate() {
            let Some(e) = e else { continue };
            let at = format!("{path}[{d}]");
            let want = self.count(&at, e, 0, MAX_ELEMENTS)?;
            if want != *has {
                return Err(format!(
                    "{at}: size mismatch: input {:?} has {has} there (shape {given:?}), the plan says {e} = {want}",
                    b.name
                ));
            }
        }
        Ok(())
    }

    pub fn lookup(&self, name: &str) -> Option<Value> {
        self.values.get(name).copied()
    }

    /// `e`'s value; an error is placed at `path`.
    pub fn eval(&self, path: &str, e: &Expr) -> Result<Value, String> {
        e.eval_in(self).map_err(|why| format!("{path}: {why}"))
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

/// Names are the inputs' sizes and the parameters; dimensions are the inputs'.
impl Scope for Env {
    fn value(&self, name: &str) -> Option<Value> {
        self.lookup(name)
    }

    fn dim(&self, name: &str, index: i64) -> Result<Value, String> {
        let (_, i) = self
            .inputs
            .iter()
            .find(|(n, _)| n == name)
            .ok_or_else(|| format!("{name}.shape[{index}]: {name:?} is not an input"))?;
        let shape = &self.shapes[*i];
        let rank = shape.len() as i64;
        let at = if index < 0 { rank + index } else { index };
        usize::try_from(at)
            .ok()
            .and_then(|at| shape.get(at))
            .map(|d| Value::Int(*d as i64))
            .ok_or_else(|| {
                format!(
                    "{name}.shape[{index}] is out of range: input {name:?} has {rank} dimensions {shape:?}"
                )
            })
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

    fn inputs(a: u64, b: u64) -> BTreeMap<String, Vec<u64>> {
        BTreeMap::from([("a".into(), vec![a]), ("b".into(), vec![b])])
    }

    #[test]
    fn sizes_geometry_and_arguments_come_from_inputs_and_parameters() {
        let plan = plan();
        let params = BTreeMap::from([("k".to_string(), Value::Float(2.0))]);
        let env = Env::new(&plan, &inputs(5, 5), &params).unwrap();
        assert_eq!(env.elements, [5, 5, 8]);
        assert_eq!(env.shapes, [vec![5], vec![5], vec![8]]);
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
        extra.insert("z".into(), vec![1]);
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

    fn matmul() -> Plan {
        let json = r#"{
            "inputs": [{"name": "x", "dtype": "f32", "shape": [null, "k"]},
                       {"name": "w", "dtype": "f32", "shape": ["x.shape[-1]", "n"]}],
            "params": [{"name": "k", "dtype": "u32"}, {"name": "n", "dtype": "u32", "default": 3}],
            "outputs": [{"name": "y", "dtype": "f32", "shape": ["x.shape[0]", "w.shape[1]"]},
                        {"name": "flat", "dtype": "f32", "elements": "x"}],
            "launches": [{"kernel": "mm", "grid": "x.shape[0]", "block": 1, "args": []}]
        }"#;
        check(&read(json.as_bytes()).unwrap()).unwrap()
    }

    fn shaped(x: &[u64], w: &[u64]) -> BTreeMap<String, Vec<u64>> {
        BTreeMap::from([("x".into(), x.to_vec()), ("w".into(), w.to_vec())])
    }

    #[test]
    fn output_shapes_come_from_input_shapes_and_parameters() {
        let plan = matmul();
        let k = BTreeMap::from([("k".to_string(), Value::Int(4))]);
        let env = Env::new(&plan, &shaped(&[2, 4], &[4, 3]), &k).unwrap();
        assert_eq!(env.shapes[2], [2, 3]);
        assert_eq!(env.elements[2], 6);
        assert_eq!(env.shapes[3], [8]);
        assert_eq!(env.shape(plan.launches()[0]).unwrap().0, [2, 1, 1]);
    }

    #[test]
    fn an_input_of_another_shape_is_refused_naming_it() {
        let plan = matmul();
        let k = BTreeMap::from([("k".to_string(), Value::Int(4))]);
        assert_eq!(
            Env::new(&plan, &shaped(&[8], &[4, 3]), &k).unwrap_err(),
            r#"inputs[0].shape: input "x" has 1 dimensions [8], the plan says 2"#
        );
        assert_eq!(
            Env::new(&plan, &shaped(&[2, 5], &[4, 3]), &k).unwrap_err(),
            r#"inputs[0].shape[1]: size mismatch: input "x" has 5 there (shape [2, 5]), the plan says k = 4"#
        );
        assert_eq!(
            Env::new(&plan, &shaped(&[2, 4], &[4, 2]), &k).unwrap_err(),
            r#"inputs[1].shape[1]: size mismatch: input "w" has 2 there (shape [4, 2]), the plan says n = 3"#
        );
        assert_eq!(
            Env::new(&plan, &shaped(&[2, 4], &[5, 3]), &k).unwrap_err(),
            r#"inputs[1].shape[0]: size mismatch: input "w" has 5 there (shape [5, 3]), the plan says x.shape[-1] = 4"#
        );
    }

    #[test]
    fn an_undeclared_inputs_dimension_out_of_range_is_refused_at_its_place() {
        let json = r#"{"inputs": [{"name": "x", "dtype": "f32"}],
            "outputs": [{"name": "y", "dtype": "f32", "shape": ["x.shape[1]"]}],
            "launches": [{"kernel": "k", "grid": 1, "block": 1, "args": []}]}"#;
        let plan = check(&read(json.as_bytes()).unwrap()).unwrap();
        let one_d = BTreeMap::from([("x".to_string(), vec![4])]);
        assert_eq!(
            Env::new(&plan, &one_d, &BTreeMap::new()).unwrap_err(),
            r#"outputs[0].shape[0]: x.shape[1] is out of range: input "x" has 1 dimensions [4]"#
        );
        let two_d = BTreeMap::from([("x".to_string(), vec![4, 2])]);
        assert_eq!(
            Env::new(&plan, &two_d, &BTreeMap::new()).unwrap().shapes[1],
            [2]
        );
    }
}
