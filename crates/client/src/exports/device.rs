//! Devices: count, names, attributes, UUIDs, PCI ids and memory, all answered
//! from the `DeviceInfo` cached at the handshake.

use std::ffi::c_char;

use super::*;
use crate::state::client;
use cumux_cuda_bindings::{consts::*, types::*};

/// One past the last device attribute cumux answers (the last cuda.h 13.0
/// defines).
const DEVICE_ATTRIBUTE_END: u32 = 148;

fn write_c_string(dst: *mut c_char, len: i32, s: &str) -> CuResult<()> {
    if dst.is_null() || len <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let buf = host_bytes_mut(dst.cast(), len as usize)?;
    let n = s.len().min(buf.len() - 1);
    buf[..n].copy_from_slice(&s.as_bytes()[..n]);
    buf[n] = 0;
    Ok(())
}

fn pci_bus_id(c: &crate::state::Client, dev: i32) -> CuResult<String> {
    let d = c.device(dev)?;
    Ok(format!(
        "{:08x}:{:02x}:{:02x}.0",
        d.pci[0], d.pci[1], d.pci[2]
    ))
}

/// `CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED`.
pub(super) const P2P_ACCESS_SUPPORTED: u32 = 2;

/// `cuDeviceGetP2PAttribute`'s value `attr` (1 ..= 4) for `dev` reaching
/// `peer`'s memory, as the server measured it on its GPUs (`DeviceInfo::peers`).
pub(super) fn peer_attribute(
    c: &crate::state::Client,
    dev: i32,
    peer: i32,
    attr: u32,
) -> CuResult<i32> {
    c.device(peer)?;
    let found = c
        .device(dev)?
        .peers
        .iter()
        .find(|(p, _)| *p as i32 == peer)
        .map(|(_, attrs)| attrs[attr as usize - 1]);
    Ok(found.unwrap_or(0))
}

driver_fn! {
    fn cuDeviceGetCount(count: *mut i32) {
        match client() {
            Ok(c) => out(count, c.devices.len() as i32),
            Err(e) => {
                out(count, 0)?;
                Err(e)
            }
        }
    }

    fn cuDeviceGet(device: *mut i32, ordinal: i32) {
        client()?.device(ordinal)?;
        out(device, ordinal)
    }

    fn cuDeviceGetName(name: *mut c_char, len: i32, dev: i32) {
        let c = client()?;
        write_c_string(name, len, &c.device(dev)?.name)
    }

    fn cuDeviceGetUuid | cuDeviceGetUuid_v2 (uuid: *mut CUuuid, dev: i32) {
        let bytes = client()?.device(dev)?.uuid.map(|b| b as c_char);
        out(uuid, CUuuid { bytes })
    }

    fn cuDeviceGetLuid(luid: *mut c_char, mask: *mut u32, dev: i32) {
        client()?.device(dev)?;
        host_bytes_mut(luid.cast(), 8)?.fill(0);
        out(mask, 1)
    }

    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: i32) {
        out(bytes, client()?.device(dev)?.total_mem as usize)
    }

    fn cuDeviceGetAttribute(value: *mut i32, attr: u32, dev: i32) {
        if attr == 0 || attr >= DEVICE_ATTRIBUTE_END {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(value, client()?.attribute(dev, attr)?)
    }

    fn cuDeviceComputeCapability(major: *mut i32, minor: *mut i32, dev: i32) {
        let c = client()?;
        out(major, c.attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?)?;
        out(minor, c.attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?)
    }

    fn cuDeviceGetPCIBusId(bus_id: *mut c_char, len: i32, dev: i32) {
        let c = client()?;
        write_c_string(bus_id, len, &pci_bus_id(c, dev)?)
    }

    fn cuDeviceGetByPCIBusId(dev: *mut i32, bus_id: *const c_char) {
        let c = client()?;
        let wanted = c_str(bus_id)?.to_ascii_lowercase();
        for i in 0..c.devices.len() as i32 {
            let id = pci_bus_id(c, i)?;
            // "0000:01:00.0" and the short "01:00.0" both name a device.
            if id == wanted || id.ends_with(&format!(":{wanted}")) || id[4..] == wanted {
                return out(dev, i);
            }
        }
        Err(CUDA_ERROR_INVALID_DEVICE)
    }

    fn cuDeviceCanAccessPeer(can: *mut i32, dev: i32, peer: i32) {
        let c = client()?;
        out(can, peer_attribute(c, dev, peer, P2P_ACCESS_SUPPORTED)?)
    }

    fn cuDeviceGetP2PAttribute(value: *mut i32, attr: u32, src: i32, dst: i32) {
        let c = client()?;
        if !(1..=4).contains(&attr) || src == dst {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(value, peer_attribute(c, src, dst, attr)?)
    }

    fn cuDeviceGetTexture1DLinearMaxWidth(width: *mut usize, _format: u32, _channels: u32, dev: i32) {
        client()?.device(dev)?;
        out(width, 1 << 27)
    }
}
