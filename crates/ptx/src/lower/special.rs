//! Special register names (`%tid.x`, `%laneid`, `%clock64`, `%lanemask_lt` …)
//! to the IR's `SReg`; cluster registers read as a cluster of one block, the
//! reserved shared memory registers name a region after the dynamic one.

use crate::ir::SReg;

/// The special register `name` names, if any.
pub(super) fn special_register(name: &str) -> Option<SReg> {
    let dim = |s: &str| -> Option<u8> {
        match s {
            "x" => Some(0),
            "y" => Some(1),
            "z" => Some(2),
            _ => None,
        }
    };
    if let Some((base, d)) = name.split_once('.') {
        let d = dim(d)?;
        return Some(match base {
            "%tid" => SReg::Tid(d),
            "%ntid" => SReg::Ntid(d),
            "%ctaid" => SReg::Ctaid(d),
            "%nctaid" => SReg::Nctaid(d),
            "%clusterid" | "%cluster_ctaid" => SReg::Zero,
            "%nclusterid" | "%cluster_nctaid" => SReg::Ntid(9),
            _ => return None,
        });
    }
    Some(match name {
        "%laneid" => SReg::Laneid,
        "%warpid" => SReg::Warpid,
        "%nwarpid" => SReg::Nwarpid,
        "%smid" => SReg::Smid,
        "%nsmid" => SReg::Nsmid,
        "%gridid" => SReg::Gridid,
        "%clock" => SReg::Clock,
        "%clock64" => SReg::Clock64,
        "%globaltimer" => SReg::Globaltimer,
        "%globaltimer_lo" => SReg::Globaltimer,
        "%lanemask_eq" => SReg::LanemaskEq,
        "%lanemask_lt" => SReg::LanemaskLt,
        "%lanemask_le" => SReg::LanemaskLe,
        "%lanemask_gt" => SReg::LanemaskGt,
        "%lanemask_ge" => SReg::LanemaskGe,
        "%dynamic_smem_size" => SReg::DynSmem,
        "%total_smem_size" => SReg::TotalSmem,
        "%cluster_ctarank" | "%is_explicit_cluster" => SReg::Zero,
        "%cluster_nctarank" => SReg::Ntid(9),
        "%reserved_smem_offset_begin" => SReg::ReservedSmem(0),
        "%reserved_smem_offset_end" => SReg::ReservedSmem(1),
        "%reserved_smem_offset_cap" => SReg::ReservedSmem(2),
        "%reserved_smem_offset_0" => SReg::ReservedSmem(3),
        "%reserved_smem_offset_1" => SReg::ReservedSmem(4),
        "%envreg1" => SReg::Envreg(1),
        "%envreg2" => SReg::Envreg(2),
        _ if name.starts_with("%envreg") || name.starts_with("%pm") => SReg::Zero,
        _ => return None,
    })
}
