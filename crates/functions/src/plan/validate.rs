//! From a plan document to a [`Plan`]: names resolved, expressions parsed and
//! their names checked, limits kept; every refusal names its place in the
//! document (`launches[2].args[1]: unknown buffer "tmp"`).

use std::collections::HashSet;

use super::dtype::DType;
use super::expr::{count, Expr, Value};
use super::model::{Arg, BufferDoc, Dims, ExprText, PlanDoc, StepDoc};

/// Most buffers of each kind, and parameters.
pub const MAX_NAMED: usize = 64;
/// Most steps in a plan, nested ones included.
pub const MAX_STEPS: usize = 256;
/// Deepest nesting of loops.
pub const MAX_NESTING: usize = 4;
/// Most arguments of one launch.
pub const MAX_ARGS: usize = 64;
/// Most times a loop may run.
pub const MAX_REPEAT: i64 = 1 << 20;
/// Longest name (bytes).
pub const MAX_NAME: usize = 64;
/// Most dimensions of a buffer's shape.
pub const MAX_RANK: usize = 8;

/// What a buffer is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferKind {
    /// Filled with the caller's data before the first launch.
    Input,
    /// Zeroed before the first launch, returned to the caller.
    Output,
    /// Zeroed before the first launch, never returned.
    Scratch,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Buffer {
    pub name: String,
    pub kind: BufferKind,
    pub dtype: DType,
    /// Elements: of outputs and scratch, this or `shape`; of an input, what
    /// its size must be.
    pub elements: Option<Expr>,
    /// Dimensions: of outputs and scratch, this or `elements` (their shape;
    /// `elements` is a one-dimensional one); of an input, what its shape must
    /// be (`None`: any size there).
    pub shape: Option<Vec<Option<Expr>>>,
    /// Where it is in the document (`inputs[1]`).
    pub path: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    pub name: String,
    pub dtype: DType,
    pub default: Option<Value>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum LaunchArg {
    /// The address of the buffer of this index (in [`Plan::buffers`]).
    Buffer(usize),
    Scalar(DType, Expr),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    pub path: String,
    pub kernel: String,
    pub grid: [Expr; 3],
    pub block: [Expr; 3],
    pub shared: Expr,
    pub args: Vec<LaunchArg>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub path: String,
    pub function: String,
    /// Each callee input or output name → this plan's buffer index.
    pub bind: Vec<(String, usize)>,
    /// Each callee parameter given → its expression over this plan's names.
    pub params: Vec<(String, Expr)>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Launch(Box<Launch>),
    Loop {
        path: String,
        times: Expr,
        steps: Vec<Step>,
    },
    Call(Call),
}

/// A checked plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Inputs, then outputs, then scratch, each in document order.
    pub buffers: Vec<Buffer>,
    pub params: Vec<Param>,
    pub steps: Vec<Step>,
}

impl Plan {
    pub fn buffer(&self, name: &str) -> Option<usize> {
        self.buffers.iter().position(|b| b.name == name)
    }

    pub fn of_kind(&self, kind: BufferKind) -> impl Iterator<Item = (usize, &Buffer)> {
        self.buffers
            .iter()
            .enumerate()
            .filter(move |(_, b)| b.kind == kind)
    }

    /// Every launch, loops walked into.
    pub fn launches(&self) -> Vec<&Launch> {
        fn walk<'a>(steps: &'a [Step], out: &mut Vec<&'a Launch>) {
            for s in steps {
                match s {
                    Step::Launch(l) => out.push(l),
                    Step::Loop { steps, .. } => walk(steps, out),
                    Step::Call(_) => {}
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.steps, &mut out);
        out
    }

    /// Every call, loops walked into.
    pub fn calls(&self) -> Vec<&Call> {
        fn walk<'a>(steps: &'a [Step], out: &mut Vec<&'a Call>) {
            for s in steps {
                match s {
                    Step::Call(c) => out.push(c),
                    Step::Loop { steps, .. } => walk(steps, out),
                    Step::Launch(_) => {}
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.steps, &mut out);
        out
    }
}

/// Whether `name` is a name a plan may give (an identifier).
fn check_name(path: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    match ok {
        true => Ok(()),
        false => Err(format!(
            "{path}.name: {name:?} is not a name (letters, digits and _, at most {MAX_NAME} bytes, not starting with a digit)"
        )),
    }
}

struct Checker<'a> {
    buffers: &'a [Buffer],
    params: &'a [Param],
    steps: usize,
}

impl Checker<'_> {
    /// Whether an expression over sizes and parameters may read `name`.
    fn readable(&self, name: &str) -> bool {
        self.params.iter().any(|p| p.name == name)
            || self
                .buffers
                .iter()
                .any(|b| b.name == name && b.kind == BufferKind::Input)
    }

    fn expr(&self, path: &str, text: &ExprText) -> Result<Expr, String> {
        let e = Expr::parse(&text.0).map_err(|why| format!("{path}: {why}"))?;
        for (name, index) in e.dims() {
            let input = self
                .buffers
                .iter()
                .find(|b| b.name == name && b.kind == BufferKind::Input)
                .ok_or_else(|| {
                    format!("{path}: {name}.shape[{index}]: {name:?} is not an input (only inputs have shapes here)")
                })?;
            if let Some(rank) = input.shape.as_ref().map(Vec::len) {
                let rank = rank as i64;
                if !(-rank..rank).contains(&index) {
                    return Err(format!(
                        "{path}: {name}.shape[{index}] is out of range: input {name:?} has {rank} dimensions ({}.shape)",
                        input.path
                    ));
                }
            }
        }
        if let Some(name) = e.names().into_iter().find(|n| !self.readable(n)) {
            return Err(format!("{path}: unknown name {name:?}"));
        }
        Ok(e)
    }

    fn dims(&self, path: &str, dims: Option<&Dims>) -> Result<[Expr; 3], String> {
        let Some(dims) = dims else {
            return Err(format!("{path}: missing"));
        };
        let mut out = [Expr::int(1), Expr::int(1), Expr::int(1)];
        for (i, text) in dims.0.iter().enumerate().take(3) {
            let at = match dims.0.len() {
                1 => path.to_string(),
                _ => format!("{path}[{i}]"),
            };
            out[i] = self.expr(&at, text)?;
        }
        Ok(out)
    }

    fn steps(&mut self, path: &str, docs: &[StepDoc], depth: usize) -> Result<Vec<Step>, String> {
        docs.iter()
            .enumerate()
            .map(|(i, doc)| self.step(&format!("{path}[{i}]"), doc, depth))
            .collect()
    }

    fn step(&mut self, path: &str, doc: &StepDoc, depth: usize) -> Result<Step, String> {
        self.steps += 1;
        if self.steps > MAX_STEPS {
            return Err(format!("{path}: a plan has at most {MAX_STEPS} steps"));
        }
        let kinds = [
            doc.kernel.is_some(),
            doc.launches.is_some(),
            doc.call.is_some(),
        ];
        if kinds.iter().filter(|k| **k).count() != 1 {
            return Err(format!(
                "{path}: a step is one of a launch (\"kernel\"), a loop (\"repeat\" and \"launches\") or a call (\"call\")"
            ));
        }
        let stray = |fields: &[(&str, bool)]| -> Result<(), String> {
            match fields.iter().find(|(_, given)| *given) {
                Some((field, _)) => {
                    Err(format!("{path}.{field}: not a field of this kind of step"))
                }
                None => Ok(()),
            }
        };
        if let Some(kernel) = &doc.kernel {
            stray(&[
                ("repeat", doc.repeat.is_some()),
                ("bind", doc.bind.is_some()),
                ("params", doc.params.is_some()),
            ])?;
            return self
                .launch(path, kernel, doc)
                .map(|l| Step::Launch(Box::new(l)));
        }
        if let Some(inner) = &doc.launches {
            stray(&[
                ("grid", doc.grid.is_some()),
                ("block", doc.block.is_some()),
                ("shared", doc.shared.is_some()),
                ("args", doc.args.is_some()),
                ("bind", doc.bind.is_some()),
                ("params", doc.params.is_some()),
            ])?;
            if depth >= MAX_NESTING {
                return Err(format!("{path}: loops nest at most {MAX_NESTING} deep"));
            }
            let times = match &doc.repeat {
                Some(text) => self.expr(&format!("{path}.repeat"), text)?,
                None => {
                    return Err(format!(
                        "{path}.repeat: missing (how many times the loop runs)"
                    ))
                }
            };
            if let Some(value) = times.constant() {
                let value = value.map_err(|why| format!("{path}.repeat: {why}"))?;
                count(value, 0, MAX_REPEAT).map_err(|why| format!("{path}.repeat: {why}"))?;
            }
            if inner.is_empty() {
                return Err(format!("{path}.launches: a loop needs at least one step"));
            }
            let steps = self.steps(&format!("{path}.launches"), inner, depth + 1)?;
            return Ok(Step::Loop {
                path: path.to_string(),
                times,
                steps,
            });
        }
        stray(&[
            ("grid", doc.grid.is_some()),
            ("block", doc.block.is_some()),
            ("shared", doc.shared.is_some()),
            ("args", doc.args.is_some()),
            ("repeat", doc.repeat.is_some()),
        ])?;
        let function = doc.call.clone().unwrap_or_default();
        let mut bind = Vec::new();
        for (callee_name, ours) in doc.bind.iter().flatten() {
            let index = self
                .buffers
                .iter()
                .position(|b| &b.name == ours)
                .ok_or_else(|| format!("{path}.bind.{callee_name}: unknown buffer {ours:?}"))?;
            bind.push((callee_name.clone(), index));
        }
        let mut params = Vec::new();
        for (name, text) in doc.params.iter().flatten() {
            params.push((
                name.clone(),
                self.expr(&format!("{path}.params.{name}"), text)?,
            ));
        }
        Ok(Step::Call(Call {
            path: path.to_string(),
            function,
            bind,
            params,
        }))
    }

    fn launch(&self, path: &str, kernel: &str, doc: &StepDoc) -> Result<Launch, String> {
        let grid = self.dims(&format!("{path}.grid"), doc.grid.as_ref())?;
        let block = self.dims(&format!("{path}.block"), doc.block.as_ref())?;
        let shared = match &doc.shared {
            Some(text) => self.expr(&format!("{path}.shared"), text)?,
            None => Expr::int(0),
        };
        let docs = doc.args.as_deref().unwrap_or_default();
        if docs.len() > MAX_ARGS {
            return Err(format!("{path}.args: at most {MAX_ARGS} arguments"));
        }
        let mut args = Vec::with_capacity(docs.len());
        for (i, arg) in docs.iter().enumerate() {
            let at = format!("{path}.args[{i}]");
            args.push(match arg {
                Arg::Buffer(name) => LaunchArg::Buffer(
                    self.buffers
                        .iter()
                        .position(|b| &b.name == name)
                        .ok_or_else(|| format!("{at}: unknown buffer {name:?}"))?,
                ),
                Arg::Scalar(dtype, text) => {
                    if !dtype.scalar_ok() {
                        return Err(format!("{at}: {} scalars are not supported", dtype.name()));
                    }
                    let e = self.expr(&at, text)?;
                    if let Some(value) = e.constant() {
                        let value = value.map_err(|why| format!("{at}: {why}"))?;
                        dtype.encode(value).map_err(|why| format!("{at}: {why}"))?;
                    }
                    LaunchArg::Scalar(*dtype, e)
                }
            });
        }
        Ok(Launch {
            path: path.to_string(),
            kernel: kernel.to_string(),
            grid,
            block,
            shared,
            args,
        })
    }
}

fn buffers(
    docs: &[BufferDoc],
    kind: BufferKind,
    field: &str,
    out: &mut Vec<Buffer>,
) -> Result<(), String> {
    if docs.len() > MAX_NAMED {
        return Err(format!("{field}: at most {MAX_NAMED}"));
    }
    for (i, doc) in docs.iter().enumerate() {
        let path = format!("{field}[{i}]");
        check_name(&path, &doc.name)?;
        match (&doc.elements, &doc.shape) {
            (None, None) if kind != BufferKind::Input => {
                return Err(format!(
                    "{path}.elements: missing (how many {} elements; or its \"shape\")",
                    doc.dtype.name()
                ))
            }
            (Some(_), Some(_)) => {
                return Err(format!("{path}: give \"elements\" or \"shape\", not both"))
            }
            _ => {}
        }
        if let Some(shape) = &doc.shape {
            if shape.len() > MAX_RANK {
                return Err(format!("{path}.shape: at most {MAX_RANK} dimensions"));
            }
            if kind != BufferKind::Input {
                if let Some(d) = shape.iter().position(Option::is_none) {
                    return Err(format!(
                        "{path}.shape[{d}]: missing (only an input's dimension may be null, any size)"
                    ));
                }
            }
        }
        out.push(Buffer {
            name: doc.name.clone(),
            kind,
            dtype: doc.dtype,
            elements: None,
            // The rank for now; the dimensions once every name is known.
            shape: doc.shape.as_ref().map(|s| vec![None; s.len()]),
            path,
        });
    }
    Ok(())
}

/// Checks `doc` and resolves it into a [`Plan`]. What needs the module (the
/// kernels' parameters) or other functions is checked by [`super::link`].
pub fn check(doc: &PlanDoc) -> Result<Plan, String> {
    let mut list = Vec::new();
    buffers(&doc.inputs, BufferKind::Input, "inputs", &mut list)?;
    buffers(&doc.outputs, BufferKind::Output, "outputs", &mut list)?;
    buffers(&doc.scratch, BufferKind::Scratch, "scratch", &mut list)?;
    if doc.params.len() > MAX_NAMED {
        return Err(format!("params: at most {MAX_NAMED}"));
    }
    let mut params = Vec::new();
    for (i, p) in doc.params.iter().enumerate() {
        let path = format!("params[{i}]");
        check_name(&path, &p.name)?;
        if !p.dtype.scalar_ok() {
            return Err(format!(
                "{path}.dtype: {} parameters are not supported",
                p.dtype.name()
            ));
        }
        let default = p
            .default
            .as_ref()
            .map(|n| p.dtype.value_of(&serde_json::Value::Number(n.clone())))
            .transpose()
            .map_err(|why| format!("{path}.default: {why}"))?;
        params.push(Param {
            name: p.name.clone(),
            dtype: p.dtype,
            default,
        });
    }
    let mut seen = HashSet::new();
    let named = list.iter().map(|b| (b.path.clone(), &b.name)).chain(
        params
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("params[{i}]"), &p.name)),
    );
    for (path, name) in named {
        if !seen.insert(name.clone()) {
            return Err(format!("{path}.name: {name:?} is named twice"));
        }
    }
    // Sizes read the inputs' sizes and the parameters.
    let docs = doc.inputs.iter().chain(&doc.outputs).chain(&doc.scratch);
    let mut sized = Vec::with_capacity(list.len());
    let checker = Checker {
        buffers: &list,
        params: &params,
        steps: 0,
    };
    // An input's size or dimension that reads its own size or shape.
    let size_expr = |buffer: &Buffer, path: &str, text: &ExprText| -> Result<Expr, String> {
        let e = checker.expr(path, text)?;
        if buffer.kind == BufferKind::Input && e.names().contains(&buffer.name.as_str()) {
            return Err(format!("{path}: an input's size cannot read its own size"));
        }
        Ok(e)
    };
    for (buffer, d) in list.iter().zip(docs) {
        let elements = match &d.elements {
            Some(text) => Some(size_expr(
                buffer,
                &format!("{}.elements", buffer.path),
                text,
            )?),
            None => None,
        };
        let shape = match &d.shape {
            Some(dims) => Some(
                dims.iter()
                    .enumerate()
                    .map(|(i, text)| {
                        text.as_ref()
                            .map(|t| size_expr(buffer, &format!("{}.shape[{i}]", buffer.path), t))
                            .transpose()
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            None => None,
        };
        sized.push(Buffer {
            elements,
            shape,
            ..buffer.clone()
        });
    }
    let mut checker = Checker {
        buffers: &sized,
        params: &params,
        steps: 0,
    };
    let steps = checker.steps("launches", &doc.launches, 0)?;
    if steps.is_empty() {
        return Err("launches: a plan needs at least one step".into());
    }
    Ok(Plan {
        buffers: sized,
        params,
        steps,
    })
}

#[cfg(test)]
mod tests {
    use super::super::model::read;
    use super::*;

    fn checked(json: &str) -> Result<Plan, String> {
        check(&read(json.as_bytes())?)
    }

    const VADD: &str = r#"{
        "inputs": [{"name": "a", "dtype": "f32"}, {"name": "b", "dtype": "f32", "elements": "a"}],
        "params": [{"name": "reps", "dtype": "u32", "default": 1}],
        "outputs": [{"name": "c", "dtype": "f32", "elements": "a"}],
        "scratch": [{"name": "t", "dtype": "f32", "elements": "a * 2"}],
        "launches": [
            {"kernel": "vadd", "grid": "cdiv(a, 128)", "block": 128,
             "args": [{"buffer": "a"}, {"buffer": "b"}, {"buffer": "c"}, {"u32": "a"}]},
            {"repeat": "reps", "launches": [
                {"kernel": "scale", "grid": [1, 1], "block": [32], "args": [{"buffer": "t"}]}
            ]}
        ]
    }"#;

    #[test]
    fn a_good_plan_resolves_names_to_buffers() {
        let plan = checked(VADD).unwrap();
        assert_eq!(plan.buffers.len(), 4);
        assert_eq!(plan.buffers[3].kind, BufferKind::Scratch);
        let launches = plan.launches();
        assert_eq!(launches.len(), 2);
        assert_eq!(launches[0].args[2], LaunchArg::Buffer(2));
        assert_eq!(launches[1].path, "launches[1].launches[0]");
        assert_eq!(plan.params[0].default, Some(Value::Int(1)));
    }

    #[test]
    fn errors_name_their_place() {
        let bad = |from: &str, to: &str| checked(&VADD.replace(from, to)).unwrap_err();
        assert_eq!(
            bad(r#"[{"buffer": "t"}]"#, r#"[{"u32": 1}, {"buffer": "tmp"}]"#),
            r#"launches[1].launches[0].args[1]: unknown buffer "tmp""#
        );
        assert_eq!(
            bad(r#""cdiv(a, 128)""#, r#""cdiv(n, 128)""#),
            r#"launches[0].grid: unknown name "n""#
        );
        assert_eq!(
            bad(r#""a * 2""#, r#""a * ""#),
            "scratch[0].elements: unexpected end"
        );
        assert_eq!(
            bad(r#""name": "t""#, r#""name": "c""#),
            r#"scratch[0].name: "c" is named twice"#
        );
        assert_eq!(
            bad(r#", "elements": "a"}],"#, "}],"),
            r#"outputs[0].elements: missing (how many f32 elements; or its "shape")"#
        );
        assert_eq!(
            bad(r#""repeat": "reps""#, r#""repeat": -1"#),
            "launches[1].repeat: -1 is not within 0..=1048576"
        );
        assert_eq!(
            bad(r#"{"u32": "a"}"#, r#"{"u32": -3}"#),
            "launches[0].args[3]: -3 does not fit u32"
        );
        assert!(bad(r#""block": [32], "#, "").starts_with("launches[1].launches[0].block: missing"));
        assert!(bad(r#""kernel": "scale", "#, "")
            .starts_with("launches[1].launches[0]: a step is one of"));
        assert_eq!(
            checked(r#"{"launches": [{"repeat": 2, "launches": []}]}"#).unwrap_err(),
            "launches[0].launches: a loop needs at least one step"
        );
        assert_eq!(
            bad(
                r#""kernel": "vadd", "#,
                r#""kernel": "vadd", "repeat": 2, "#
            ),
            "launches[0].repeat: not a field of this kind of step"
        );
        assert_eq!(
            bad(
                r#""elements": "a"}],
        "params""#,
                r#""elements": "b"}],
        "params""#
            ),
            "inputs[1].elements: an input's size cannot read its own size"
        );
    }

    const MATMUL: &str = r#"{
        "inputs": [{"name": "x", "dtype": "f32", "shape": [null, "k"]},
                   {"name": "w", "dtype": "f32", "shape": ["x.shape[1]", "n"]}],
        "params": [{"name": "k", "dtype": "u32"}, {"name": "n", "dtype": "u32"}],
        "outputs": [{"name": "y", "dtype": "f32", "shape": ["x.shape[0]", "w.shape[-1]"]}],
        "scratch": [{"name": "t", "dtype": "f32", "shape": [4, "n"]}],
        "launches": [{"kernel": "mm", "grid": ["cdiv(w.shape[1], 16)", "x.shape[0]"], "block": 16,
                      "args": [{"buffer": "x"}, {"buffer": "w"}, {"buffer": "y"}]}]
    }"#;

    #[test]
    fn shapes_are_lists_of_expressions_over_inputs_shapes_and_parameters() {
        let plan = checked(MATMUL).unwrap();
        let x = &plan.buffers[0];
        let shape = x.shape.as_ref().unwrap();
        assert_eq!(shape.len(), 2);
        assert!(shape[0].is_none());
        assert_eq!(shape[1].as_ref().unwrap().to_string(), "k");
        let y = &plan.buffers[2];
        assert_eq!(y.kind, BufferKind::Output);
        assert_eq!(y.elements, None);
        let dims: Vec<String> = y
            .shape
            .iter()
            .flatten()
            .flatten()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(dims, ["x.shape[0]", "w.shape[-1]"]);
    }

    #[test]
    fn shape_errors_name_their_place() {
        let bad = |from: &str, to: &str| {
            assert!(MATMUL.contains(from), "{from}");
            checked(&MATMUL.replace(from, to)).unwrap_err()
        };
        assert_eq!(
            bad(
                r#""shape": ["x.shape[0]", "w.shape[-1]"]"#,
                r#""shape": ["x.shape[2]", "n"]"#
            ),
            r#"outputs[0].shape[0]: x.shape[2] is out of range: input "x" has 2 dimensions (inputs[0].shape)"#
        );
        assert_eq!(
            bad(r#""w.shape[-1]""#, r#""t.shape[0]""#),
            r#"outputs[0].shape[1]: t.shape[0]: "t" is not an input (only inputs have shapes here)"#
        );
        assert_eq!(
            bad(r#""w.shape[-1]""#, r#""m""#),
            r#"outputs[0].shape[1]: unknown name "m""#
        );
        assert_eq!(
            bad(r#""w.shape[-1]""#, "null"),
            "outputs[0].shape[1]: missing (only an input's dimension may be null, any size)"
        );
        assert_eq!(
            bad(
                r#""shape": [4, "n"]"#,
                r#""shape": [4, "n"], "elements": 8"#
            ),
            r#"scratch[0]: give "elements" or "shape", not both"#
        );
        assert_eq!(
            bad(r#""shape": [4, "n"]"#, r#""shape": [1,1,1,1,1,1,1,1,1]"#),
            "scratch[0].shape: at most 8 dimensions"
        );
        assert_eq!(
            bad(r#"[null, "k"]"#, r#"[null, "x.shape[0]"]"#),
            "inputs[0].shape[1]: an input's size cannot read its own size"
        );
        assert_eq!(
            bad(r#""cdiv(w.shape[1], 16)""#, r#""cdiv(w.shape[2], 16)""#),
            r#"launches[0].grid[0]: w.shape[2] is out of range: input "w" has 2 dimensions (inputs[1].shape)"#
        );
        assert!(bad(r#""shape": [4, "n"]"#, r#""shape": [4, "n +"]"#)
            .starts_with("scratch[0].shape[1]: "));
        assert!(bad(r#""shape": [4, "n"]"#, r#""shape": [4, true]"#)
            .starts_with("scratch[0].shape[1]: expected a number or an expression string"));
        // An input without a declared shape may be read at any index (checked per invocation).
        let free = MATMUL.replace(r#""shape": [null, "k"]"#, r#""elements": "k * 2""#);
        assert!(checked(&free.replace("x.shape[0]", "x.shape[5]")).is_ok());
    }
}
