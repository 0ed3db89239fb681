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
    /// Elements: required of outputs and scratch; of an input, what its size
    /// must be.
    pub elements: Option<Expr>,
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

/// `text` parsed, reading only `allowed` names.
fn expr(path: &str, text: &ExprText, allowed: &dyn Fn(&str) -> bool) -> Result<Expr, String> {
    let e = Expr::parse(&text.0).map_err(|why| format!("{path}: {why}"))?;
    if let Some(name) = e.names().into_iter().find(|n| !allowed(n)) {
        return Err(format!("{path}: unknown name {name:?}"));
    }
    Ok(e)
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
        expr(path, text, &|n| self.readable(n))
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
        if kind != BufferKind::Input && doc.elements.is_none() {
            return Err(format!(
                "{path}.elements: missing (how many {} elements)",
                doc.dtype.name()
            ));
        }
        out.push(Buffer {
            name: doc.name.clone(),
            kind,
            dtype: doc.dtype,
            elements: None,
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
    for (buffer, d) in list.iter().zip(docs) {
        let elements = match &d.elements {
            Some(text) => {
                let checker = Checker {
                    buffers: &list,
                    params: &params,
                    steps: 0,
                };
                let path = format!("{}.elements", buffer.path);
                let e = checker.expr(&path, text)?;
                if buffer.kind == BufferKind::Input && e.names().contains(&buffer.name.as_str()) {
                    return Err(format!("{path}: an input's size cannot read its own size"));
                }
                Some(e)
            }
            None => None,
        };
        sized.push(Buffer {
            elements,
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
            "outputs[0].elements: missing (how many f32 elements)"
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
}
