//! Element types of a plan's buffers and scalars: their names, sizes, and
//! how a scalar value becomes the bytes a kernel parameter holds.

use serde::{Deserialize, Serialize};

use super::expr::Value;

/// An element type, named as in the plan (`f32`, `u64` …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    U64,
    I64,
    F16,
    Bf16,
    F32,
    F64,
}

/// Every type, for messages and lookups.
pub const ALL: [DType; 12] = [
    DType::U8,
    DType::I8,
    DType::U16,
    DType::I16,
    DType::U32,
    DType::I32,
    DType::U64,
    DType::I64,
    DType::F16,
    DType::Bf16,
    DType::F32,
    DType::F64,
];

impl DType {
    pub fn name(self) -> &'static str {
        match self {
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::U16 => "u16",
            DType::I16 => "i16",
            DType::U32 => "u32",
            DType::I32 => "i32",
            DType::U64 => "u64",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    /// The type named `name`.
    pub fn parse(name: &str) -> Option<DType> {
        ALL.into_iter().find(|d| d.name() == name)
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            DType::U8 | DType::I8 => 1,
            DType::U16 | DType::I16 | DType::F16 | DType::Bf16 => 2,
            DType::U32 | DType::I32 | DType::F32 => 4,
            DType::U64 | DType::I64 | DType::F64 => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::Bf16 | DType::F32 | DType::F64)
    }

    /// Whether a scalar of this type can be a kernel argument or a parameter.
    pub fn scalar_ok(self) -> bool {
        !matches!(self, DType::F16 | DType::Bf16)
    }

    /// The range of an integer type.
    fn int_range(self) -> (i128, i128) {
        match self {
            DType::U8 => (0, u8::MAX.into()),
            DType::I8 => (i8::MIN.into(), i8::MAX.into()),
            DType::U16 => (0, u16::MAX.into()),
            DType::I16 => (i16::MIN.into(), i16::MAX.into()),
            DType::U32 => (0, u32::MAX.into()),
            DType::I32 => (i32::MIN.into(), i32::MAX.into()),
            DType::U64 => (0, u64::MAX.into()),
            _ => (i64::MIN.into(), i64::MAX.into()),
        }
    }

    /// `value` as this type's little-endian bytes: an integer type takes an
    /// integer within its range, a float type any number.
    pub fn encode(self, value: Value) -> Result<Vec<u8>, String> {
        if !self.scalar_ok() {
            return Err(format!("{} scalars are not supported", self.name()));
        }
        match (self.is_float(), value) {
            (true, v) => {
                let x = match v {
                    Value::Int(i) => i as f64,
                    Value::Float(f) => f,
                };
                Ok(match self {
                    DType::F32 => (x as f32).to_le_bytes().to_vec(),
                    _ => x.to_le_bytes().to_vec(),
                })
            }
            (false, Value::Float(f)) => {
                Err(format!("{f} is not an integer, as {} needs", self.name()))
            }
            (false, Value::Int(i)) => {
                let (lo, hi) = self.int_range();
                if !(lo..=hi).contains(&i128::from(i)) {
                    return Err(format!("{i} does not fit {}", self.name()));
                }
                let bytes = i.to_le_bytes();
                Ok(bytes[..self.size() as usize].to_vec())
            }
        }
    }

    /// A JSON number as a value of this type (checked as [`DType::encode`] does).
    pub fn value_of(self, number: &serde_json::Value) -> Result<Value, String> {
        let value = if self.is_float() {
            number.as_f64().map(Value::Float)
        } else {
            number.as_i64().map(Value::Int)
        };
        let value = value.ok_or_else(|| format!("{number} is not a {} value", self.name()))?;
        self.encode(value)?;
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_encode_little_endian_within_range() {
        assert_eq!(DType::U32.encode(Value::Int(258)), Ok(vec![2, 1, 0, 0]));
        assert_eq!(
            DType::F32.encode(Value::Int(1)),
            Ok(1f32.to_le_bytes().to_vec())
        );
        assert_eq!(DType::I8.encode(Value::Int(-1)), Ok(vec![255]));
        assert!(DType::U32
            .encode(Value::Int(-1))
            .unwrap_err()
            .contains("does not fit"));
        assert!(DType::U8.encode(Value::Float(1.5)).is_err());
        assert!(DType::F16.encode(Value::Float(1.5)).is_err());
        assert_eq!(DType::parse("bf16"), Some(DType::Bf16));
        assert_eq!(DType::parse("float"), None);
    }
}
