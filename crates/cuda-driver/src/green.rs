//! Green contexts: a context that runs its kernels on part of a device's SMs
//! and shares the primary context's memory; cumux's per-tenant SM parts.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;

use crate::driver::{cu, Context, ContextKind, DeviceId, Driver};
use crate::error::CudaError;
use crate::sys::{CUcontext, CUdevResourceDesc, CUgreenCtx};

/// `CU_DEV_RESOURCE_TYPE_SM`.
const RESOURCE_TYPE_SM: c_int = 1;
/// `CU_GREEN_CTX_DEFAULT_STREAM`: the green context gets a null stream of its own.
const GREEN_CTX_DEFAULT_STREAM: c_uint = 1;
/// `sizeof(CUdevResource)` in CUDA 12.4 to 13: its type, 92 bytes of
/// padding, a 40-byte union and the next-resource pointer (13) or a 48-byte
/// union (12). Arrays of them (a split's groups) have this stride.
const RESOURCE_BYTES: usize = 144;
/// Where a `CUdevResource`'s SM part starts (after its type and padding).
const SM_OFFSET: usize = 96;
/// The most groups a device is split into (an H100's 132 SMs give 15).
const MOST_GROUPS: usize = 64;

/// The bytes of resources the driver fills, zeroed, 8-byte aligned.
struct Resources(Vec<u64>);

impl Resources {
    fn new(count: usize) -> Resources {
        Resources(vec![0; count * RESOURCE_BYTES / 8])
    }

    fn ptr(&mut self) -> *mut c_void {
        self.0.as_mut_ptr().cast()
    }

    /// The address of resource `index`, for a descriptor made of several.
    fn at(&mut self, index: usize) -> *mut c_void {
        // SAFETY: callers pass an index below the count the buffer was
        // made for, so the offset stays inside it.
        unsafe { self.ptr().cast::<u8>().add(index * RESOURCE_BYTES).cast() }
    }

    /// Resource `index`'s type and the `n`th `u32` of its SM part
    /// (`smCount`, `minSmPartitionSize`, `smCoscheduledAlignment`).
    fn field(&self, index: usize, byte: usize) -> u32 {
        let at = index * RESOURCE_BYTES + byte;
        let word = self.0[at / 8].to_ne_bytes();
        let b = at % 8;
        u32::from_ne_bytes([word[b], word[b + 1], word[b + 2], word[b + 3]])
    }

    fn sm_field(&self, index: usize, n: usize) -> u32 {
        self.field(index, SM_OFFSET + 4 * n)
    }

    fn is_sm(&self, index: usize) -> bool {
        self.field(index, 0) == RESOURCE_TYPE_SM as u32
    }
}

/// A part of a device's SMs as the driver splits it: `groups` groups of
/// the layout's alignment, the SMs no group took after them (`rest`).
/// Every process that splits the same device this way gets the same SMs in
/// each group, so parts made of different groups never share an SM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmGroups {
    pub groups: u32,
    pub group_sms: u32,
    pub rest: u32,
}

/// Which of a split's groups a part takes: `first..end`, where index
/// `groups` stands for the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupSpan {
    pub first: u32,
    pub end: u32,
}

impl SmGroups {
    /// Where parts may start and end, in SMs from the front: every group's
    /// start, then the rest's (if any SMs are left), then the device's end.
    fn boundaries(&self) -> Vec<u32> {
        let mut at: Vec<u32> = (0..=self.groups).map(|g| g * self.group_sms).collect();
        if self.rest > 0 {
            at.push(self.groups * self.group_sms + self.rest);
        }
        at
    }

    /// The groups of the stretch `from..to` (percent of the device's SMs):
    /// the boundaries nearest its ends, and at least one group. Stretches
    /// that meet give spans that meet, so disjoint stretches never share a
    /// group (unless one is too small for a group of its own).
    pub fn span(&self, from: u8, to: u8) -> GroupSpan {
        let bounds = self.boundaries();
        let total = *bounds.last().unwrap_or(&0);
        let nearest = |percent: u8| -> u32 {
            let want = f64::from(total) * f64::from(percent.min(100)) / 100.0;
            let mut best = 0;
            for (i, b) in bounds.iter().enumerate() {
                if (f64::from(*b) - want).abs() < (f64::from(bounds[best]) - want).abs() {
                    best = i;
                }
            }
            best as u32
        };
        let last = bounds.len().saturating_sub(1) as u32;
        let (mut first, mut end) = (nearest(from), nearest(to));
        if end <= first {
            end = (first + 1).min(last);
            first = end.saturating_sub(1);
        }
        GroupSpan { first, end }
    }

    /// The SMs of a span.
    pub fn sms(&self, span: GroupSpan) -> u32 {
        (span.first..span.end)
            .map(|g| {
                if g < self.groups {
                    self.group_sms
                } else {
                    self.rest
                }
            })
            .sum()
    }
}

impl Driver {
    /// Device `dev`'s SMs split into groups of its alignment, and the rest:
    /// the resources (groups first, then the rest) and their shape.
    fn sm_groups(&self, dev: DeviceId) -> Result<(Resources, SmGroups), CudaError> {
        let mut all = Resources::new(1);
        let mut split = Resources::new(MOST_GROUPS + 1);
        let mut groups = MOST_GROUPS as c_uint;
        // SAFETY: `all` holds one resource and `split` room for
        // `MOST_GROUPS` groups and then the rest, at the driver's stride;
        // `groups` says how many the driver may write.
        unsafe {
            cu!(
                self,
                cuDeviceGetDevResource(dev.0, all.ptr(), RESOURCE_TYPE_SM)
            )?;
            let rest = split.at(MOST_GROUPS);
            let align = all.sm_field(0, 2).max(all.sm_field(0, 1)).max(1);
            cu!(
                self,
                cuDevSmResourceSplitByCount(split.ptr(), &mut groups, all.ptr(), rest, 0, align)
            )?;
        }
        let count = groups as usize;
        let shape = SmGroups {
            groups: groups.min(MOST_GROUPS as c_uint),
            group_sms: split.sm_field(0, 0),
            rest: split.sm_field(MOST_GROUPS, 0),
        };
        let odd = count == 0
            || count > MOST_GROUPS
            || (0..count).any(|g| !split.is_sm(g) || split.sm_field(g, 0) != shape.group_sms)
            || shape.groups * shape.group_sms + shape.rest != all.sm_field(0, 0);
        if odd {
            let detail = format!(
                "the driver split {} SMs into {count} groups this build cannot read",
                all.sm_field(0, 0)
            );
            // CUDA_ERROR_NOT_SUPPORTED
            return Err(CudaError::new(
                801,
                "CUDA_ERROR_NOT_SUPPORTED",
                "cuDevSmResourceSplitByCount",
            )
            .with_detail(detail));
        }
        // The rest's resource moves right behind the last group, so a span
        // that ends with it is one run of resources.
        let (from, to) = (MOST_GROUPS * RESOURCE_BYTES / 8, count * RESOURCE_BYTES / 8);
        split.0.copy_within(from..from + RESOURCE_BYTES / 8, to);
        Ok((split, shape))
    }

    /// A green context on the stretch `from..to` (percent) of device
    /// `dev`'s SMs, as whole groups of the driver's split ([`SmGroups::span`]),
    /// and the SMs it got and the first group. It shares the primary
    /// context's memory; every launch made with it current, or on a stream
    /// made while it is, runs on its SMs only.
    pub fn green_context(
        self: &Arc<Self>,
        dev: DeviceId,
        from: u8,
        to: u8,
    ) -> Result<(Arc<Context>, u32, GroupSpan), CudaError> {
        let (mut split, shape) = self.sm_groups(dev)?;
        let span = shape.span(from, to);
        let mut desc: CUdevResourceDesc = std::ptr::null_mut();
        let mut green: CUgreenCtx = std::ptr::null_mut();
        // SAFETY: the span's resources are consecutive in `split` (groups,
        // then the rest), and the out-pointers are valid.
        unsafe {
            let first = split.at(span.first as usize);
            cu!(
                self,
                cuDevResourceGenerateDesc(&mut desc, first, span.end - span.first)
            )?;
            cu!(
                self,
                cuGreenCtxCreate(&mut green, desc, dev.0, GREEN_CTX_DEFAULT_STREAM)
            )?;
        }
        let mut raw: CUcontext = std::ptr::null_mut();
        // SAFETY: `green` is the live green context just made.
        if let Err(e) = unsafe { cu!(self, cuCtxFromGreenCtx(&mut raw, green)) } {
            // SAFETY: as above; nothing else holds it.
            let _ = unsafe { cu!(self, cuGreenCtxDestroy(green)) };
            return Err(e);
        }
        let context = Context {
            driver: Arc::clone(self),
            raw,
            device: dev,
            kind: ContextKind::Green(green),
        };
        Ok((Arc::new(context), shape.sms(span), span))
    }
}

#[cfg(test)]
mod tests {
    use super::{GroupSpan, SmGroups};

    /// An H100 as driver 580 splits it: 15 groups of 8 SMs, 12 left.
    const H100: SmGroups = SmGroups {
        groups: 15,
        group_sms: 8,
        rest: 12,
    };

    #[test]
    fn a_cap_from_the_front_gets_the_nearest_whole_groups() {
        let sms = |to| H100.sms(H100.span(0, to));
        assert_eq!([1, 10, 25, 50, 75, 99].map(sms), [8, 16, 32, 64, 96, 132]);
    }

    #[test]
    fn stretches_that_meet_get_groups_that_meet() {
        let cuts = [0, 25, 50, 75, 100];
        let spans: Vec<GroupSpan> = cuts.windows(2).map(|w| H100.span(w[0], w[1])).collect();
        for pair in spans.windows(2) {
            assert_eq!(pair[0].end, pair[1].first, "{spans:?}");
        }
        assert_eq!(spans[0].first, 0);
        assert_eq!(spans[3].end, 16, "the last takes the rest");
        let sms: u32 = spans.iter().map(|s| H100.sms(*s)).sum();
        assert_eq!(sms, 132);
    }

    #[test]
    fn a_stretch_too_small_for_a_group_gets_one() {
        assert_eq!(H100.span(40, 41), GroupSpan { first: 7, end: 8 });
        assert_eq!(H100.span(100, 100), GroupSpan { first: 15, end: 16 });
        let even = SmGroups {
            groups: 4,
            group_sms: 2,
            rest: 0,
        };
        assert_eq!(even.span(99, 100), GroupSpan { first: 3, end: 4 });
    }
}
