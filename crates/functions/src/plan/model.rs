//! A plan as its JSON document says it: buffers, parameters and steps, read
//! with serde (unknown fields refused); [`super::validate`] checks the meaning.

use std::collections::BTreeMap;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

use super::dtype::DType;

/// An expression as written: a JSON number or a string.
#[derive(Debug, Clone, PartialEq)]
pub struct ExprText(pub String);

impl<'de> Deserialize<'de> for ExprText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::Number(n) => Ok(ExprText(n.to_string())),
            serde_json::Value::String(s) => Ok(ExprText(s)),
            other => Err(D::Error::custom(format!(
                "expected a number or an expression string, found {other}"
            ))),
        }
    }
}

/// Launch dimensions as written: one expression (x) or a list of 1 to 3.
#[derive(Debug, Clone, PartialEq)]
pub struct Dims(pub Vec<ExprText>);

impl<'de> Deserialize<'de> for Dims {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let one = |v: serde_json::Value| -> Result<ExprText, D::Error> {
            ExprText::deserialize(v).map_err(D::Error::custom)
        };
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::Array(items) => {
                if items.is_empty() || items.len() > 3 {
                    return Err(D::Error::custom(format!(
                        "expected 1 to 3 dimensions, found {}",
                        items.len()
                    )));
                }
                items
                    .into_iter()
                    .map(one)
                    .collect::<Result<_, _>>()
                    .map(Dims)
            }
            other => Ok(Dims(vec![one(other)?])),
        }
    }
}

/// A kernel argument: `{"buffer": NAME}` (its device address) or
/// `{"<dtype>": EXPR}` (a scalar of that type).
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    Buffer(String),
    Scalar(DType, ExprText),
}

impl<'de> Deserialize<'de> for Arg {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<String, serde_json::Value>::deserialize(d)?;
        let mut entries = map.into_iter();
        let (Some((key, value)), None) = (entries.next(), entries.next()) else {
            return Err(D::Error::custom(
                "an argument is an object of one key: \"buffer\" or a scalar type (\"u32\", \"f32\" …)",
            ));
        };
        if key == "buffer" {
            return match value {
                serde_json::Value::String(name) => Ok(Arg::Buffer(name)),
                other => Err(D::Error::custom(format!(
                    "\"buffer\" names a buffer, found {other}"
                ))),
            };
        }
        let dtype = DType::parse(&key).ok_or_else(|| {
            D::Error::custom(format!(
                "unknown argument kind {key:?}: \"buffer\" or a scalar type (\"u32\", \"f32\" …)"
            ))
        })?;
        let expr = ExprText::deserialize(value).map_err(D::Error::custom)?;
        Ok(Arg::Scalar(dtype, expr))
    }
}

/// A named buffer: an input (its size and shape are the data given, which
/// `elements` or `shape` may constrain), an output or scratch (sized by
/// `elements`, or by `shape`: one expression per dimension; an input's
/// dimension may be `null`, any size).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BufferDoc {
    pub name: String,
    pub dtype: DType,
    #[serde(default)]
    pub elements: Option<ExprText>,
    #[serde(default)]
    pub shape: Option<Vec<Option<ExprText>>>,
}

/// A named scalar parameter the caller gives (or its default).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamDoc {
    pub name: String,
    pub dtype: DType,
    #[serde(default)]
    pub default: Option<serde_json::Number>,
}

/// One step: a launch (`kernel`), a loop (`repeat` + `launches`) or a call
/// of another function (`call`, `bind`, `params`). Exactly one kind.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepDoc {
    #[serde(default)]
    pub kernel: Option<String>,
    #[serde(default)]
    pub grid: Option<Dims>,
    #[serde(default)]
    pub block: Option<Dims>,
    /// Dynamic shared memory, bytes.
    #[serde(default)]
    pub shared: Option<ExprText>,
    #[serde(default)]
    pub args: Option<Vec<Arg>>,
    #[serde(default)]
    pub repeat: Option<ExprText>,
    #[serde(default)]
    pub launches: Option<Vec<StepDoc>>,
    #[serde(default)]
    pub call: Option<String>,
    /// The callee's inputs and outputs → this function's buffers.
    #[serde(default)]
    pub bind: Option<BTreeMap<String, String>>,
    /// The callee's parameters → expressions over this function's names.
    #[serde(default)]
    pub params: Option<BTreeMap<String, ExprText>>,
}

/// The plan document.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanDoc {
    #[serde(default)]
    pub inputs: Vec<BufferDoc>,
    #[serde(default)]
    pub params: Vec<ParamDoc>,
    #[serde(default)]
    pub outputs: Vec<BufferDoc>,
    #[serde(default)]
    pub scratch: Vec<BufferDoc>,
    pub launches: Vec<StepDoc>,
}

/// Reads a plan document; a malformed one is refused with the place
/// (`launches[2].args[1]: …`).
pub fn read(json: &[u8]) -> Result<PlanDoc, String> {
    let mut de = serde_json::Deserializer::from_slice(json);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        // The place is the path; serde_json's line and column say less.
        let inner = inner
            .rsplit_once(" at line ")
            .map_or(inner.as_str(), |(m, _)| m);
        match path.as_str() {
            "." | "" => format!("plan: {inner}"),
            _ => format!("{path}: {inner}"),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_plan_is_refused_at_its_place() {
        let e = read(br#"{"launches": [{"kernel": "k", "args": [{"buffer": "a"}, {"f33": 1}]}]}"#)
            .unwrap_err();
        assert!(
            e.starts_with("launches[0].args[1]: unknown argument kind \"f33\""),
            "{e}"
        );
        let e = read(br#"{"launches": [{"kernel": "k", "grdi": 1}]}"#).unwrap_err();
        assert!(
            e.starts_with("launches[0].grdi: unknown field `grdi`"),
            "{e}"
        );
        assert!(!e.contains("at line"), "{e}");
        let e =
            read(br#"{"inputs": [{"name": "a", "dtype": "f128"}], "launches": []}"#).unwrap_err();
        assert!(
            e.starts_with("inputs[0].dtype: unknown variant `f128`"),
            "{e}"
        );
        let e = read(br#"{"launches": [{"kernel": "k", "grid": [1,2,3,4]}]}"#).unwrap_err();
        assert!(
            e.starts_with("launches[0].grid: expected 1 to 3 dimensions"),
            "{e}"
        );
        let e = read(br#""x""#).unwrap_err();
        assert!(e.starts_with("plan: "), "{e}");
    }

    #[test]
    fn arguments_and_dimensions_read_as_written() {
        let plan = read(
            br#"{"launches": [{"kernel": "k", "grid": "cdiv(n, 128)", "block": [128, 2],
                 "args": [{"buffer": "a"}, {"u32": "n"}, {"f32": 2.5}]}]}"#,
        )
        .unwrap();
        let step = &plan.launches[0];
        assert_eq!(step.grid, Some(Dims(vec![ExprText("cdiv(n, 128)".into())])));
        assert_eq!(step.block.as_ref().map(|b| b.0.len()), Some(2));
        let args = step.args.as_ref().unwrap();
        assert_eq!(args[0], Arg::Buffer("a".into()));
        assert_eq!(args[2], Arg::Scalar(DType::F32, ExprText("2.5".into())));
    }
}
