//! Module globals a move put elsewhere (issue 17): a GPU's driver places a
//! module's memory itself, so after a move a global may live at another
//! address than the one its program holds. Every call's device addresses
//! (and each 8-byte word of its kernel parameters) in such a global's old
//! range are turned into the new one before the session sees the call.

use std::collections::BTreeMap;

use cumux_protocol::{Call, DevicePtr};

/// A global's range as its program knows it, and where it is now.
#[derive(Debug, Default, Clone)]
pub struct Aliases {
    /// The program's address → (bytes, the current address).
    ranges: BTreeMap<DevicePtr, (u64, DevicePtr)>,
}

impl Aliases {
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Where the program's `ptr` is now.
    pub fn current(&self, ptr: DevicePtr) -> DevicePtr {
        match self.ranges.range(..=ptr).next_back() {
            Some((&base, &(bytes, now))) if ptr - base < bytes => now.wrapping_add(ptr - base),
            _ => ptr,
        }
    }

    /// Each alias: (the program's address, bytes, the current address), as
    /// a session image carries them to another context or server.
    pub fn entries(&self) -> Vec<(DevicePtr, u64, DevicePtr)> {
        self.ranges
            .iter()
            .map(|(&base, &(bytes, now))| (base, bytes, now))
            .collect()
    }

    /// The aliases an image carried ([`Aliases::entries`]).
    pub fn from_entries(entries: &[(DevicePtr, u64, DevicePtr)]) -> Self {
        Aliases {
            ranges: entries
                .iter()
                .map(|&(base, bytes, now)| (base, (bytes, now)))
                .collect(),
        }
    }

    /// The program's ranges (its addresses, bytes).
    pub fn program_ranges(&self) -> impl Iterator<Item = (DevicePtr, u64)> + '_ {
        self.ranges.iter().map(|(&base, &(bytes, _))| (base, bytes))
    }

    /// A move put the global of `bytes` that was at `from` at `to`: the
    /// program's address for it (`from` itself, or the one aliased to it)
    /// now leads to `to`.
    pub fn moved(&mut self, from: DevicePtr, bytes: u64, to: DevicePtr) {
        let known = self
            .ranges
            .iter()
            .find(|(_, &(_, now))| now == from)
            .map(|(&base, _)| base);
        let program = known.unwrap_or(from);
        if program == to {
            self.ranges.remove(&program);
        } else {
            self.ranges.insert(program, (bytes, to));
        }
    }

    /// Forgets the alias that leads to `now` (its module is unloaded).
    pub fn forget_current(&mut self, now: DevicePtr) {
        self.ranges.retain(|_, &mut (_, current)| current != now);
    }

    /// Each 8-byte word of `params` that is an address in an aliased range,
    /// turned into the current one.
    pub fn params(&self, params: &mut [u8]) {
        for word in params.chunks_exact_mut(8) {
            let value = u64::from_le_bytes(word.try_into().unwrap_or_default());
            let now = self.current(value);
            if now != value {
                word.copy_from_slice(&now.to_le_bytes());
            }
        }
    }

    /// `call` with its device addresses current.
    pub fn call(&self, mut call: Call) -> Call {
        match &mut call {
            Call::MemFree { ptr }
            | Call::MemAddressRange { ptr }
            | Call::IpcGetMemHandle { ptr }
            | Call::IpcCloseMemHandle { ptr } => *ptr = self.current(*ptr),
            Call::MemcpyHtoD { dst, .. }
            | Call::Memset { dst, .. }
            | Call::MemcpyHtoDHost { dst, .. } => *dst = self.current(*dst),
            Call::MemcpyDtoH { src, .. } | Call::MemcpyDtoHHost { src, .. } => {
                *src = self.current(*src)
            }
            Call::MemcpyDtoD { dst, src, .. } => {
                *dst = self.current(*dst);
                *src = self.current(*src);
            }
            Call::Launch { params, .. } => self.params(params),
            Call::GraphCreate { launches } => {
                for l in launches {
                    self.params(&mut l.params);
                }
            }
            Call::TensorMapEncode { request } => {
                request.global_address = self.current(request.global_address)
            }
            _ => {}
        }
        call
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_in_a_moved_global_lead_to_its_new_place() {
        let mut a = Aliases::default();
        a.moved(0x1000, 0x100, 0x9000);
        assert_eq!(a.current(0x1000), 0x9000);
        assert_eq!(a.current(0x10ff), 0x90ff);
        assert_eq!(a.current(0x1100), 0x1100);
        assert_eq!(a.current(0xfff), 0xfff);
        // A second move keeps the program's address as the key.
        a.moved(0x9000, 0x100, 0x5000);
        assert_eq!(a.current(0x1010), 0x5010);
        assert_eq!(
            a.program_ranges().collect::<Vec<_>>(),
            vec![(0x1000, 0x100)]
        );
        // Back where the program knows it: no alias left.
        a.moved(0x5000, 0x100, 0x1000);
        assert!(a.is_empty());
    }

    #[test]
    fn kernel_parameters_and_copies_are_rewritten() {
        let mut a = Aliases::default();
        a.moved(0x7f00_0000_1000, 0x100, 0x7e00_0000_2000);
        let mut params = Vec::new();
        params.extend_from_slice(&7u32.to_le_bytes());
        params.extend_from_slice(&0u32.to_le_bytes());
        params.extend_from_slice(&0x7f00_0000_1008u64.to_le_bytes());
        a.params(&mut params);
        assert_eq!(&params[8..], &0x7e00_0000_2008u64.to_le_bytes());
        assert_eq!(&params[..4], &7u32.to_le_bytes());
        let call = a.call(Call::MemcpyDtoD {
            dst: 0x7f00_0000_1010,
            src: 0x42,
            bytes: 4,
            stream: None,
        });
        assert!(matches!(
            call,
            Call::MemcpyDtoD {
                dst: 0x7e00_0000_2010,
                src: 0x42,
                ..
            }
        ));
    }
}
