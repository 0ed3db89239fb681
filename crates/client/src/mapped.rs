//! Whether an address lies in a file the process mapped (a loaded program or
//! shared library), from `/proc/self/maps`, re-read only for addresses not seen.

use std::sync::Mutex;

/// Ranges `[start, end)` mapped from regular files, as of the last reading.
static FILE_RANGES: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// Whether `addr` lies in a mapping of a regular file: memory that stays as it
/// is until that file is unmapped (`dlclose`), unlike the heap or the stack.
pub fn in_mapped_file(addr: usize) -> bool {
    let mut ranges = FILE_RANGES.lock().unwrap_or_else(|p| p.into_inner());
    if covers(&ranges, addr) {
        return true;
    }
    match std::fs::read_to_string("/proc/self/maps") {
        Ok(maps) => *ranges = file_ranges(&maps),
        Err(_) => return false,
    }
    covers(&ranges, addr)
}

fn covers(ranges: &[(usize, usize)], addr: usize) -> bool {
    ranges
        .iter()
        .any(|&(start, end)| start <= addr && addr < end)
}

/// The file-backed ranges of a `/proc/PID/maps` text: lines whose path names
/// a file (not `[heap]`, an anonymous mapping, a device, a memfd or a deleted file).
fn file_ranges(maps: &str) -> Vec<(usize, usize)> {
    maps.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let range = fields.next()?;
            let path = fields.nth(4)?;
            let file = path.starts_with('/')
                && !path.starts_with("/dev/")
                && !path.starts_with("/memfd:")
                && !line.ends_with("(deleted)");
            if !file {
                return None;
            }
            let (start, end) = range.split_once('-')?;
            Some((
                usize::from_str_radix(start, 16).ok()?,
                usize::from_str_radix(end, 16).ok()?,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_mappings_are_told_from_the_rest() {
        let maps = "\
5555-6666 r--p 00000000 08:01 42 /usr/lib/libtorch_cuda.so
6666-7777 rw-p 00000000 00:00 0 [heap]
7777-8888 rw-p 00000000 00:00 0
8888-9999 r--s 00000000 00:01 7 /memfd:cumux (deleted)
9999-aaaa rw-s 00000000 00:05 3 /dev/nvidia0
aaaa-bbbb r-xp 00000000 08:01 43 /tmp/gone.so (deleted)";
        assert_eq!(file_ranges(maps), vec![(0x5555, 0x6666)]);
    }

    static IN_THIS_BINARY: [u8; 4] = [1, 2, 3, 4];

    #[test]
    fn static_data_is_mapped_and_the_heap_is_not() {
        assert!(in_mapped_file(IN_THIS_BINARY.as_ptr() as usize));
        let heap = Box::new([0u8; 64]);
        assert!(!in_mapped_file(heap.as_ptr() as usize));
    }
}
