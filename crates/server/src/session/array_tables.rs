//! A session's CUDA arrays, mipmapped arrays, texture and surface objects as
//! data: each array's shape, its backend id and the bytes charged for it;
//! what the tenant is charged for an array, estimated from above.

use std::collections::{BTreeMap, HashMap};

use cumux_protocol::arrays::{ArrayShape, TextureMade, ARRAY_CUBEMAP, ARRAY_LAYERED};
use cumux_protocol::Handle;

/// Arrays, mipmapped arrays and objects one session may hold at once.
pub const MAX_ARRAY_OBJECTS: usize = 1 << 16;

/// Arrays are charged as GPUs lay them out, in tiles, rounded up: rows
/// padded to 512 bytes, a layer's rows to 32 (of a 2-D or 3-D array), a
/// 3-D array's layers to 8 (not a layered array's), and 64 KiB at least.
const ROW_ALIGN: u64 = 512;
const ROWS_ALIGN: u64 = 32;
const LAYERS_ALIGN: u64 = 8;
const MIN_ARRAY_BYTES: u64 = 64 << 10;

pub struct ArrayEntry {
    pub backend: u64,
    pub shape: ArrayShape,
    /// Bytes charged to the tenant (0 for a mipmapped array's level).
    pub bytes: u64,
    /// The mipmapped array whose level it is, if it is one.
    pub level_of: Option<Handle>,
}

pub struct MipmapEntry {
    pub backend: u64,
    pub shape: ArrayShape,
    pub levels: u32,
    pub bytes: u64,
    /// The levels handed out as arrays, by level.
    pub level_arrays: BTreeMap<u32, Handle>,
}

#[derive(Default)]
pub struct ArrayTables {
    pub arrays: HashMap<Handle, ArrayEntry>,
    pub mipmaps: HashMap<Handle, MipmapEntry>,
    /// Texture objects (the driver's values) and what each was made of.
    pub textures: HashMap<u64, TextureMade>,
    /// Surface objects (the driver's values) and their arrays.
    pub surfaces: HashMap<u64, Handle>,
}

impl ArrayTables {
    pub fn is_empty(&self) -> bool {
        self.arrays.is_empty()
            && self.mipmaps.is_empty()
            && self.textures.is_empty()
            && self.surfaces.is_empty()
    }

    /// Whether one more object would pass [`MAX_ARRAY_OBJECTS`].
    pub fn full(&self) -> bool {
        self.arrays.len() + self.mipmaps.len() + self.textures.len() + self.surfaces.len()
            >= MAX_ARRAY_OBJECTS
    }
}

/// The bytes charged for an array of `shape` with `levels` mipmap levels
/// (1: a plain array); `None` where the shape is not one cumux carries or
/// its size overflows.
pub fn charge_of(shape: &ArrayShape, levels: u32) -> Option<u64> {
    let mut total = 0u64;
    for level in 0..levels.max(1) {
        let s = shape.level(level);
        let row = s.row_bytes()?.checked_next_multiple_of(ROW_ALIGN)?;
        let (rows, layers) = s.rows_and_layers();
        let rows = match rows {
            1 => 1,
            rows => rows.checked_next_multiple_of(ROWS_ALIGN)?,
        };
        let layered = s.flags & (ARRAY_LAYERED | ARRAY_CUBEMAP) != 0;
        let layers = match layers {
            1 => 1,
            layers if layered => layers,
            layers => layers.checked_next_multiple_of(LAYERS_ALIGN)?,
        };
        total = total.checked_add(row.checked_mul(rows)?.checked_mul(layers)?)?;
    }
    Some(total.max(MIN_ARRAY_BYTES))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_round_up_and_sum_levels() {
        let shape = ArrayShape {
            width: 1000,
            height: 1000,
            depth: 0,
            format: 0x20,
            channels: 1,
            flags: 0,
        };
        let one = charge_of(&shape, 1).unwrap();
        assert_eq!(one, 4096 * 1024);
        assert!(charge_of(&shape, 10).unwrap() > one);
        let tiny = ArrayShape {
            width: 4,
            height: 4,
            ..shape
        };
        assert_eq!(charge_of(&tiny, 1), Some(MIN_ARRAY_BYTES));
        assert_eq!(
            charge_of(
                &ArrayShape {
                    channels: 3,
                    ..shape
                },
                1
            ),
            None
        );
    }
}
