//! Conversions between the driver's types and cumux's: errors, launch
//! attributes, kernel attributes and parameter layouts, and fill patterns
//! as the memsets that write them.

use cumux_cuda_driver::{CudaError, FunctionAttributes, LaunchAttr, Stream};
use cumux_protocol::{codes, CuError, DevicePtr, FunctionAttrs, LaunchAttribute, ParamInfo};

/// The driver's error as the protocol's.
pub fn cu_err(e: CudaError) -> CuError {
    CuError::new(e.code, e.to_string())
}

/// A launch attribute as the driver takes it (`CUlaunchAttributeID`, value).
pub fn launch_attr(a: &LaunchAttribute) -> LaunchAttr {
    let (id, value) = match *a {
        LaunchAttribute::Cooperative(v) => (2, [v, 0, 0]),
        LaunchAttribute::ClusterDim(dims) => (4, dims),
        LaunchAttribute::ClusterSchedulingPolicy(v) => (5, [v, 0, 0]),
        LaunchAttribute::ProgrammaticSerialization(v) => (6, [v, 0, 0]),
        LaunchAttribute::Priority(v) => (8, [v as u32, 0, 0]),
        LaunchAttribute::MemSyncDomain(v) => (10, [v, 0, 0]),
    };
    LaunchAttr { id, value }
}

/// The protocol's view of a kernel's attributes.
pub fn function_attrs(a: &FunctionAttributes) -> FunctionAttrs {
    FunctionAttrs {
        max_threads_per_block: a.max_threads_per_block,
        shared_size_bytes: a.shared_size_bytes,
        const_size_bytes: a.const_size_bytes,
        local_size_bytes: a.local_size_bytes,
        num_regs: a.num_regs,
        ptx_version: a.ptx_version,
        binary_version: a.binary_version,
        max_dynamic_shared_size_bytes: a.max_dynamic_shared_size_bytes,
    }
}

/// The protocol's view of a parameter layout.
pub fn param_infos(layout: &[(u32, u32)]) -> Vec<ParamInfo> {
    layout
        .iter()
        .map(|&(offset, size)| ParamInfo { offset, size })
        .collect()
}

/// The 1-, 2- or 4-byte value a fill pattern repeats.
pub fn fill_value(pattern: &[u8]) -> Option<Fill> {
    match *pattern {
        [a] => Some(Fill::D8(a)),
        [a, b] => Some(Fill::D16(u16::from_le_bytes([a, b]))),
        [a, b, c, d] => Some(Fill::D32(u32::from_le_bytes([a, b, c, d]))),
        _ => None,
    }
}

/// A memset of one element width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    D8(u8),
    D16(u16),
    D32(u32),
}

/// The memset that writes `pattern`, or the error for a pattern of another width.
pub fn fill_of(pattern: &[u8]) -> Result<Fill, CuError> {
    fill_value(pattern)
        .ok_or_else(|| CuError::new(codes::INVALID_VALUE, "a fill pattern is 1, 2 or 4 bytes"))
}

/// Queues `count` elements of `fill` at `dst` on `stream`.
pub fn memset(stream: &Stream, dst: DevicePtr, fill: Fill, count: u64) -> Result<(), CuError> {
    match fill {
        Fill::D8(v) => stream.memset_d8(dst, v, count),
        Fill::D16(v) => stream.memset_d16(dst, v, count),
        Fill::D32(v) => stream.memset_d32(dst, v, count),
    }
    .map_err(cu_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_patterns_map_to_memset_widths() {
        assert_eq!(fill_value(&[7]), Some(Fill::D8(7)));
        assert_eq!(fill_value(&[1, 2]), Some(Fill::D16(0x0201)));
        assert_eq!(fill_value(&[1, 2, 3, 4]), Some(Fill::D32(0x0403_0201)));
        assert_eq!(fill_value(&[1, 2, 3]), None);
        assert_eq!(fill_value(&[]), None);
    }

    #[test]
    fn layouts_and_attributes_convert_to_the_protocol() {
        let infos = param_infos(&[(0, 8), (8, 4), (16, 8)]);
        assert_eq!(
            infos[2],
            ParamInfo {
                offset: 16,
                size: 8
            }
        );
        let attrs = function_attrs(&FunctionAttributes {
            max_threads_per_block: 1024,
            num_regs: 32,
            binary_version: 90,
            ..FunctionAttributes::default()
        });
        assert_eq!(attrs.max_threads_per_block, 1024);
        assert_eq!(attrs.num_regs, 32);
        assert_eq!(attrs.binary_version, 90);
    }
}
