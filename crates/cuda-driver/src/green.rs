//! Green contexts: a context that runs its kernels on part of a device's SMs
//! and shares the primary context's memory; cumux's per-tenant SM caps.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;

use crate::driver::{cu, Context, ContextKind, DeviceId, Driver};
use crate::error::CudaError;
use crate::sys::{CUcontext, CUdevResourceDesc, CUgreenCtx};

/// `CU_DEV_RESOURCE_TYPE_SM`.
const RESOURCE_TYPE_SM: c_int = 1;
/// `CU_GREEN_CTX_DEFAULT_STREAM`: the green context gets a null stream of its own.
const GREEN_CTX_DEFAULT_STREAM: c_uint = 1;
/// Where a `CUdevResource`'s SM part starts (after its type and 92 bytes of
/// padding); the struct is 144 bytes in CUDA 13, and [`Resource`] has room
/// to spare for a driver that grows it.
const SM_OFFSET: usize = 96;

/// The bytes of one `CUdevResource`, zeroed, as the driver fills them.
#[repr(C, align(8))]
struct Resource([u8; 256]);

impl Resource {
    fn new() -> Resource {
        Resource([0; 256])
    }

    fn ptr(&mut self) -> *mut c_void {
        self.0.as_mut_ptr().cast()
    }

    /// The `n`th `u32` of the SM part (`smCount`, `minSmPartitionSize`,
    /// `smCoscheduledAlignment`).
    fn sm_field(&self, n: usize) -> u32 {
        let at = SM_OFFSET + 4 * n;
        u32::from_ne_bytes([self.0[at], self.0[at + 1], self.0[at + 2], self.0[at + 3]])
    }
}

/// How a device's SMs can be split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmLayout {
    pub total: u32,
    /// The fewest SMs a part may have.
    pub min_partition: u32,
    /// A part's SM count is a multiple of this.
    pub alignment: u32,
}

impl SmLayout {
    /// The SMs a cap of `percent` gets: the count nearest `percent` of the
    /// device that the driver can split off, never below the smallest part
    /// nor above the device. 100 is the whole device.
    pub fn sms_for(&self, percent: u8) -> u32 {
        if percent >= 100 {
            return self.total;
        }
        let align = self.alignment.max(1);
        let wanted = f64::from(self.total) * f64::from(percent) / 100.0;
        let nearest = ((wanted / f64::from(align)).round() as u32) * align;
        nearest.max(self.min_partition).min(self.total)
    }
}

impl Driver {
    /// How device `dev`'s SMs can be split (`cuDeviceGetDevResource`).
    pub fn sm_layout(&self, dev: DeviceId) -> Result<SmLayout, CudaError> {
        let mut all = Resource::new();
        // SAFETY: `all` has room for a `CUdevResource` and is 8-byte aligned.
        unsafe {
            cu!(
                self,
                cuDeviceGetDevResource(dev.0, all.ptr(), RESOURCE_TYPE_SM)
            )?
        };
        Ok(SmLayout {
            total: all.sm_field(0),
            min_partition: all.sm_field(1),
            alignment: all.sm_field(2),
        })
    }

    /// A green context on `sms` of device `dev`'s SMs (the driver may round
    /// up to its alignment) and the count it got. It shares the primary
    /// context's memory; every launch made with it current, or on a stream
    /// made while it is, runs on its SMs only.
    pub fn green_context(
        self: &Arc<Self>,
        dev: DeviceId,
        sms: u32,
    ) -> Result<(Arc<Context>, u32), CudaError> {
        let (mut all, mut part, mut rest) = (Resource::new(), Resource::new(), Resource::new());
        let mut groups: c_uint = 1;
        let mut desc: CUdevResourceDesc = std::ptr::null_mut();
        let mut green: CUgreenCtx = std::ptr::null_mut();
        // SAFETY: each resource buffer has room for a `CUdevResource` (one
        // group asked for, so `part` holds one), and the out-pointers are valid.
        unsafe {
            cu!(
                self,
                cuDeviceGetDevResource(dev.0, all.ptr(), RESOURCE_TYPE_SM)
            )?;
            cu!(
                self,
                cuDevSmResourceSplitByCount(part.ptr(), &mut groups, all.ptr(), rest.ptr(), 0, sms)
            )?;
            cu!(self, cuDevResourceGenerateDesc(&mut desc, part.ptr(), 1))?;
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
        Ok((Arc::new(context), part.sm_field(0)))
    }
}

#[cfg(test)]
mod tests {
    use super::SmLayout;

    #[test]
    fn a_cap_gets_the_nearest_count_the_device_can_split_off() {
        // An H100: 132 SMs, parts of at least 8, in multiples of 8.
        let h100 = SmLayout {
            total: 132,
            min_partition: 8,
            alignment: 8,
        };
        let got: Vec<u32> = [1, 10, 25, 50, 75, 99, 100]
            .map(|p| h100.sms_for(p))
            .to_vec();
        assert_eq!(got, [8, 16, 32, 64, 96, 128, 132]);
        // A driver that reports no alignment still gets whole SMs.
        let plain = SmLayout {
            total: 10,
            min_partition: 1,
            alignment: 0,
        };
        assert_eq!(plain.sms_for(25), 3);
    }
}
