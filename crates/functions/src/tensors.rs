//! The data of an invocation: named tensors (dtype, shape, bytes) and scalar
//! parameters, read from and written as safetensors (a small JSON header with
//! dtype and shape, then raw bytes; parameters in its `__metadata__`) or JSON
//! (a tensor's numbers as lists nested as deep as it has dimensions).

use std::collections::{BTreeMap, HashMap};

use safetensors::{Dtype, SafeTensors};
use serde_json::{json, Map, Value as Json};

use crate::plan::expr::Value;
use crate::plan::DType;

/// The media type of the binary form.
pub const SAFETENSORS: &str = "application/x-safetensors";
/// Most dimensions of a tensor.
const MAX_RANK: usize = 8;

/// One tensor: its type, shape and little-endian bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub data: Vec<u8>,
}

impl Tensor {
    pub fn elements(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// What a caller sends: tensors by name, and parameters by name as JSON
/// numbers (typed later by the plan).
#[derive(Debug, Default)]
pub struct Request {
    pub tensors: BTreeMap<String, Tensor>,
    pub params: BTreeMap<String, Json>,
}

fn to_safetensors(d: DType) -> Dtype {
    match d {
        DType::U8 => Dtype::U8,
        DType::I8 => Dtype::I8,
        DType::U16 => Dtype::U16,
        DType::I16 => Dtype::I16,
        DType::U32 => Dtype::U32,
        DType::I32 => Dtype::I32,
        DType::U64 => Dtype::U64,
        DType::I64 => Dtype::I64,
        DType::F16 => Dtype::F16,
        DType::Bf16 => Dtype::BF16,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
    }
}

fn from_safetensors(d: Dtype) -> Option<DType> {
    crate::plan::dtype::ALL
        .into_iter()
        .find(|ours| to_safetensors(*ours) == d)
}

/// Reads a safetensors body: every tensor, and the parameters its metadata
/// gives (each value a JSON number as text).
pub fn read_safetensors(body: &[u8]) -> Result<Request, String> {
    // The header is parsed and checked once (the offsets run on from 0 with
    // no gap, and end where the body does): its tensors' bytes are read
    // straight from the body after it.
    let (n, metadata) =
        SafeTensors::read_metadata(body).map_err(|e| format!("not a safetensors body: {e}"))?;
    let data = body
        .get(8 + n..)
        .ok_or_else(|| "not a safetensors body: shorter than its header".to_string())?;
    let mut request = Request::default();
    for (name, info) in metadata.tensors() {
        let dtype = from_safetensors(info.dtype)
            .ok_or_else(|| format!("inputs.{name}: dtype {:?} is not supported", info.dtype))?;
        let (start, end) = info.data_offsets;
        let bytes = data
            .get(start..end)
            .ok_or_else(|| format!("inputs.{name}: its data lies outside the body"))?;
        request.tensors.insert(
            name,
            Tensor {
                dtype,
                shape: info.shape.iter().map(|d| *d as u64).collect(),
                data: bytes.to_vec(),
            },
        );
    }
    for (name, text) in metadata.metadata().iter().flatten() {
        let number: Json = serde_json::from_str(text)
            .ok()
            .filter(Json::is_number)
            .ok_or_else(|| format!("params.{name}: {text:?} is not a number"))?;
        request.params.insert(name.clone(), number);
    }
    Ok(request)
}

/// Writes tensors as a safetensors body.
pub fn write_safetensors(tensors: &BTreeMap<String, Tensor>) -> Result<Vec<u8>, String> {
    let views = tensors
        .iter()
        .map(|(name, t)| {
            let shape = t.shape.iter().map(|d| *d as usize).collect();
            safetensors::tensor::TensorView::new(to_safetensors(t.dtype), shape, &t.data)
                .map(|v| (name.clone(), v))
                .map_err(|e| format!("{name}: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize(views, None).map_err(|e| e.to_string())
}

/// `value`'s numbers in order and the shape its nesting gives them: a number
/// has none, a list of numbers one dimension, a list of equally long lists
/// one more. `path` places the error.
fn flatten(value: Json, path: &str) -> Result<(Vec<u64>, Vec<Json>), String> {
    let Json::Array(items) = value else {
        return Ok((Vec::new(), vec![value]));
    };
    let nested = items.first().is_some_and(Json::is_array);
    if !nested {
        if let Some(i) = items.iter().position(Json::is_array) {
            return Err(format!(
                "{path}[{i}]: a list among numbers (lists nest evenly)"
            ));
        }
        return Ok((vec![items.len() as u64], items));
    }
    let (mut inner, mut flat) = (None, Vec::new());
    let outer = items.len() as u64;
    for (i, item) in items.into_iter().enumerate() {
        let at = format!("{path}[{i}]");
        if !item.is_array() {
            return Err(format!("{at}: a number among lists (lists nest evenly)"));
        }
        let (shape, numbers) = flatten(item, &at)?;
        match &inner {
            None => inner = Some(shape),
            Some(first) if *first != shape => {
                return Err(format!(
                    "{at}: shape {shape:?}, the first of its siblings has {first:?} (lists nest evenly)"
                ))
            }
            Some(_) => {}
        }
        flat.extend(numbers);
    }
    let mut shape = vec![outer];
    shape.extend(inner.unwrap_or_default());
    if shape.len() > MAX_RANK {
        return Err(format!("{path}: at most {MAX_RANK} dimensions"));
    }
    Ok((shape, flat))
}

/// `flat` numbers nested as `shape` says (a number for no dimension).
fn nest(flat: &mut std::vec::IntoIter<Json>, shape: &[u64]) -> Json {
    match shape.split_first() {
        None => flat.next().unwrap_or(Json::Null),
        Some((n, rest)) => Json::Array((0..*n).map(|_| nest(flat, rest)).collect()),
    }
}

/// Reads a JSON body: `{"inputs": {NAME: numbers | {"dtype", "shape",
/// "data"}}, "params": {NAME: number}}`, numbers as a list (one dimension) or
/// lists nested evenly (as many dimensions as deep). Bare numbers take the
/// plan's type (`dtype_of`) and the shape of their nesting.
pub fn read_json(body: &[u8], dtype_of: &dyn Fn(&str) -> Option<DType>) -> Result<Request, String> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Doc {
        #[serde(default)]
        inputs: BTreeMap<String, Json>,
        #[serde(default)]
        params: BTreeMap<String, Json>,
    }
    let doc: Doc = serde_json::from_slice(body).map_err(|e| format!("not a JSON request: {e}"))?;
    let mut request = Request {
        params: doc.params,
        ..Request::default()
    };
    for (name, value) in doc.inputs {
        let path = format!("inputs.{name}");
        let (dtype, shape, data) = match value {
            Json::Array(items) => {
                let dtype = dtype_of(&name)
                    .ok_or_else(|| format!("{path}: the function has no input {name:?}"))?;
                let (shape, data) = flatten(Json::Array(items), &path)?;
                (dtype, shape, data)
            }
            Json::Object(mut fields) => {
                let dtype = match fields.remove("dtype") {
                    Some(Json::String(s)) => DType::parse(&s)
                        .ok_or_else(|| format!("{path}.dtype: unknown dtype {s:?}"))?,
                    None => dtype_of(&name)
                        .ok_or_else(|| format!("{path}: the function has no input {name:?}"))?,
                    Some(other) => {
                        return Err(format!("{path}.dtype: {other} is not a dtype name"))
                    }
                };
                let Some(data @ Json::Array(_)) = fields.remove("data") else {
                    return Err(format!("{path}.data: missing, or not a list of numbers"));
                };
                let (nested, data) = flatten(data, &format!("{path}.data"))?;
                let shape = match fields.remove("shape") {
                    None => nested,
                    Some(shape) => {
                        let shape = serde_json::from_value::<Vec<u64>>(shape)
                            .map_err(|_| format!("{path}.shape: not a list of sizes"))?;
                        // Flat numbers take any shape of as many; nested ones their own.
                        if nested.len() > 1 && nested != shape {
                            return Err(format!(
                                "{path}.data: nested as {nested:?}, the shape says {shape:?}"
                            ));
                        }
                        shape
                    }
                };
                if let Some(key) = fields.keys().next() {
                    return Err(format!("{path}.{key}: unknown field (dtype, shape, data)"));
                }
                (dtype, shape, data)
            }
            other => {
                return Err(format!(
                    "{path}: {other} is neither a list nor a tensor object"
                ))
            }
        };
        if shape.len() > MAX_RANK {
            return Err(format!("{path}.shape: at most {MAX_RANK} dimensions"));
        }
        let elements = shape.iter().try_fold(1u64, |n, d| n.checked_mul(*d));
        if elements != Some(data.len() as u64) {
            return Err(format!(
                "{path}: shape {shape:?} does not hold the {} values given",
                data.len()
            ));
        }
        let mut bytes = Vec::with_capacity(data.len() * dtype.size() as usize);
        for (i, v) in data.iter().enumerate() {
            let value = dtype
                .value_of(v)
                .map_err(|why| format!("{path}.data[{i}]: {why}"))?;
            bytes.extend(
                dtype
                    .encode(value)
                    .map_err(|why| format!("{path}.data[{i}]: {why}"))?,
            );
        }
        request.tensors.insert(
            name,
            Tensor {
                dtype,
                shape,
                data: bytes,
            },
        );
    }
    Ok(request)
}

/// The numbers of `t`, as JSON.
fn numbers(t: &Tensor) -> Result<Vec<Json>, String> {
    let size = t.dtype.size() as usize;
    t.data
        .chunks_exact(size)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..size].copy_from_slice(c);
            let signed = |bits: u32| {
                let raw = u64::from_le_bytes(b);
                let shift = 64 - bits;
                json!(((raw << shift) as i64) >> shift)
            };
            Ok(match t.dtype {
                DType::U8 | DType::U16 | DType::U32 | DType::U64 => json!(u64::from_le_bytes(b)),
                DType::I8 => signed(8),
                DType::I16 => signed(16),
                DType::I32 => signed(32),
                DType::I64 => signed(64),
                DType::F32 => json!(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                DType::F64 => json!(f64::from_le_bytes(b)),
                DType::F16 | DType::Bf16 => {
                    return Err(format!(
                        "{} outputs are sent as safetensors only",
                        t.dtype.name()
                    ))
                }
            })
        })
        .collect()
}

/// Writes tensors as JSON: `{"outputs": {NAME: {"dtype", "shape", "data"}}}`,
/// `data` nested as deep as the shape has dimensions (a list for one, a
/// number for none).
pub fn write_json(tensors: &BTreeMap<String, Tensor>) -> Result<Json, String> {
    let mut outputs = Map::new();
    for (name, t) in tensors {
        let data = nest(&mut numbers(t)?.into_iter(), &t.shape);
        outputs.insert(
            name.clone(),
            json!({"dtype": t.dtype.name(), "shape": t.shape, "data": data}),
        );
    }
    Ok(json!({ "outputs": outputs }))
}

/// The parameters a request gives, typed by the plan's (`dtype_of`).
pub fn typed_params(
    params: &BTreeMap<String, Json>,
    dtype_of: &dyn Fn(&str) -> Option<DType>,
) -> Result<BTreeMap<String, Value>, String> {
    params
        .iter()
        .map(|(name, v)| {
            let dtype = dtype_of(name)
                .ok_or_else(|| format!("params.{name}: the function has no parameter {name:?}"))?;
            let value = dtype
                .value_of(v)
                .map_err(|why| format!("params.{name}: {why}"))?;
            Ok((name.clone(), value))
        })
        .collect()
}

/// Metadata a safetensors writer may carry for parameters (tests, clients).
pub fn params_metadata(params: &BTreeMap<String, Json>) -> HashMap<String, String> {
    params
        .iter()
        .map(|(k, v)| (k.clone(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safetensors_round_trip_with_parameters() {
        let t = Tensor {
            dtype: DType::F32,
            shape: vec![2, 2],
            data: [1f32, 2.0, 3.0, 4.0]
                .iter()
                .flat_map(|f| f.to_le_bytes())
                .collect(),
        };
        let tensors = BTreeMap::from([("a".to_string(), t.clone())]);
        let params = BTreeMap::from([("k".to_string(), json!(2.5))]);
        let views = vec![(
            "a".to_string(),
            safetensors::tensor::TensorView::new(Dtype::F32, vec![2, 2], &t.data).unwrap(),
        )];
        let body = safetensors::serialize(views, Some(params_metadata(&params))).unwrap();
        let read = read_safetensors(&body).unwrap();
        assert_eq!(read.tensors, tensors);
        assert_eq!(read.params, params);
        let written = write_safetensors(&tensors).unwrap();
        assert_eq!(read_safetensors(&written).unwrap().tensors, tensors);
        assert!(read_safetensors(b"garbage")
            .unwrap_err()
            .starts_with("not a safetensors body"));
    }

    #[test]
    fn json_inputs_take_the_plans_types() {
        let body = br#"{"inputs": {"a": [1, 2, 3], "b": {"dtype": "i32", "shape": [1, 2], "data": [-1, 7]}},
                        "params": {"k": 3}}"#;
        let r = read_json(body, &|n| (n == "a").then_some(DType::F32)).unwrap();
        assert_eq!(r.tensors["a"].shape, [3]);
        assert_eq!(&r.tensors["a"].data[4..8], &2f32.to_le_bytes());
        assert_eq!(r.tensors["b"].data, [255, 255, 255, 255, 7, 0, 0, 0]);
        let out = write_json(&r.tensors).unwrap();
        assert_eq!(out["outputs"]["b"]["data"], json!([[-1, 7]]));
        assert_eq!(out["outputs"]["a"]["data"], json!([1.0, 2.0, 3.0]));
        let e = read_json(br#"{"inputs": {"a": [1, "x"]}}"#, &|_| Some(DType::U8)).unwrap_err();
        assert_eq!(e, "inputs.a.data[1]: \"x\" is not a u8 value");
        let e = read_json(
            br#"{"inputs": {"a": {"shape": [3], "data": [1]}}}"#,
            &|_| Some(DType::U8),
        )
        .unwrap_err();
        assert!(e.starts_with("inputs.a: shape [3] does not hold"), "{e}");
    }

    #[test]
    fn nested_json_lists_are_shapes() {
        let body = br#"{"inputs": {"x": [[1, 2, 3], [4, 5, 6]],
                                   "y": {"dtype": "i32", "data": [[[1], [2]]]},
                                   "z": {"shape": [3, 1], "data": [7, 8, 9]}}}"#;
        let r = read_json(body, &|_| Some(DType::F32)).unwrap();
        assert_eq!(r.tensors["x"].shape, [2, 3]);
        assert_eq!(&r.tensors["x"].data[20..24], &6f32.to_le_bytes());
        assert_eq!(r.tensors["y"].shape, [1, 2, 1]);
        assert_eq!(r.tensors["z"].shape, [3, 1]);
        let out = write_json(&r.tensors).unwrap();
        assert_eq!(
            out["outputs"]["x"]["data"],
            json!([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
        );
        assert_eq!(out["outputs"]["x"]["shape"], json!([2, 3]));
        assert_eq!(out["outputs"]["y"]["data"], json!([[[1], [2]]]));
        assert_eq!(out["outputs"]["z"]["data"], json!([[7.0], [8.0], [9.0]]));
        let scalar = Tensor {
            dtype: DType::U8,
            shape: vec![],
            data: vec![5],
        };
        let empty = Tensor {
            dtype: DType::U8,
            shape: vec![2, 0],
            data: vec![],
        };
        let out = write_json(&BTreeMap::from([("s".into(), scalar), ("e".into(), empty)])).unwrap();
        assert_eq!(out["outputs"]["s"]["data"], json!(5));
        assert_eq!(out["outputs"]["e"]["data"], json!([[], []]));
        let bad = |body: &[u8]| read_json(body, &|_| Some(DType::F32)).unwrap_err();
        assert_eq!(
            bad(br#"{"inputs": {"x": [[1, 2], [3]]}}"#),
            "inputs.x[1]: shape [1], the first of its siblings has [2] (lists nest evenly)"
        );
        assert_eq!(
            bad(br#"{"inputs": {"x": [[1, 2], 3]}}"#),
            "inputs.x[1]: a number among lists (lists nest evenly)"
        );
        assert_eq!(
            bad(br#"{"inputs": {"x": [1, [2]]}}"#),
            "inputs.x[1]: a list among numbers (lists nest evenly)"
        );
        assert_eq!(
            bad(br#"{"inputs": {"x": {"shape": [3, 2], "data": [[1, 2, 3], [4, 5, 6]]}}}"#),
            "inputs.x.data: nested as [2, 3], the shape says [3, 2]"
        );
    }
}
