//! `CUDA_VISIBLE_DEVICES` as NVIDIA's driver reads it: which of the devices a
//! program is offered it sees, and in what order. The client sends the text in
//! its hello; the server applies it; `cumux run` applies it too, to warn first.

/// The longest `CUDA_VISIBLE_DEVICES` text a hello carries (bytes); a longer
/// one is cut by the client at the last whole entry.
pub const MAX_TEXT_BYTES: usize = 1024;

/// What a `CUDA_VISIBLE_DEVICES` list chose among the devices offered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// Indices into the offered devices, in the order the program sees them
    /// (its device 0 first).
    pub chosen: Vec<usize>,
    /// Why the list ended before its last entry: as with NVIDIA's driver, the
    /// first entry that names no device (or one already listed) ends it.
    pub stopped: Option<String>,
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as `nvidia-smi -L` writes a uuid.
pub fn uuid_text(uuid: &[u8; 16]) -> String {
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Applies `text` to the devices offered, given by their uuids in order.
/// Entries are device ordinals (`1`) or uuids (`GPU-…`, or a prefix of one
/// that names a single device), comma-separated; an empty list shows none.
pub fn select(text: &str, uuids: &[[u8; 16]]) -> Selection {
    let mut chosen = Vec::new();
    let text = text.trim();
    if text.is_empty() {
        return Selection {
            chosen,
            stopped: None,
        };
    }
    for (position, entry) in text.split(',').map(str::trim).enumerate() {
        let found = match find(entry, uuids) {
            Ok(index) if chosen.contains(&index) => Err(format!("lists device {index} twice")),
            found => found,
        };
        match found {
            Ok(index) => chosen.push(index),
            Err(why) => {
                return Selection {
                    chosen,
                    stopped: Some(format!("entry {} ({entry:?}) {why}", position + 1)),
                }
            }
        }
    }
    Selection {
        chosen,
        stopped: None,
    }
}

/// The index of the device `entry` names, or why it names none.
fn find(entry: &str, uuids: &[[u8; 16]]) -> Result<usize, String> {
    let count = uuids.len();
    if !entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit()) {
        return match entry.parse::<usize>() {
            Ok(index) if index < count => Ok(index),
            _ if count == 0 => Err("names no device: none is offered".into()),
            _ => Err(format!(
                "names no device: {count} offered (ordinals 0 to {})",
                count - 1
            )),
        };
    }
    let lower = entry.to_ascii_lowercase();
    if lower.starts_with("mig-") {
        return Err("is a MIG instance, which cumux does not serve".into());
    }
    if lower.starts_with("gpu-") && lower.len() > 4 {
        let matching: Vec<usize> = uuids
            .iter()
            .enumerate()
            .filter(|(_, uuid)| uuid_text(uuid).to_ascii_lowercase().starts_with(&lower))
            .map(|(index, _)| index)
            .collect();
        return match matching[..] {
            [index] => Ok(index),
            [] => Err("matches the uuid of no device offered".into()),
            _ => Err("matches the uuids of several devices".into()),
        };
    }
    Err("is neither a device ordinal nor a GPU- uuid".into())
}

/// `text` cut to at most [`MAX_TEXT_BYTES`], at the end of an entry.
pub fn cut(text: &str) -> &str {
    if text.len() <= MAX_TEXT_BYTES {
        return text;
    }
    let head = crate::cut_to(text, MAX_TEXT_BYTES);
    head.rfind(',').map_or("", |end| &head[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 16] = [0xaa; 16];
    const B: [u8; 16] = [0xbb; 16];
    const C: [u8; 16] = [0xab; 16];

    fn chosen(text: &str) -> Vec<usize> {
        select(text, &[A, B, C]).chosen
    }

    #[test]
    fn ordinals_in_the_order_given() {
        assert_eq!(chosen("1,0"), [1, 0]);
        assert_eq!(chosen(" 2 , 0 "), [2, 0]);
        assert_eq!(chosen("0,1,2"), [0, 1, 2]);
        assert_eq!(chosen(""), Vec::<usize>::new());
        assert_eq!(select("", &[A]).stopped, None);
    }

    #[test]
    fn the_list_ends_at_the_first_entry_that_names_no_device() {
        // NVIDIA's example: 0,2,-1,1 shows devices 0 and 2.
        let s = select("0,2,-1,1", &[A, B, C]);
        assert_eq!(s.chosen, [0, 2]);
        let why = s.stopped.unwrap();
        assert!(why.contains("entry 3 (\"-1\")"), "{why}");
        assert_eq!(chosen("1,7,0"), [1]);
        assert!(select("1,7,0", &[A, B, C])
            .stopped
            .unwrap()
            .contains("3 offered (ordinals 0 to 2)"));
        assert_eq!(chosen("0,0,1"), [0]);
        assert!(select("0,0", &[A]).stopped.unwrap().contains("twice"));
        assert_eq!(chosen("x,0"), Vec::<usize>::new());
        assert_eq!(chosen("0,,1"), [0]);
        assert_eq!(chosen("99999999999999999999999"), Vec::<usize>::new());
        let none = select("0", &[]);
        assert!(none.chosen.is_empty());
        assert!(none.stopped.unwrap().contains("none is offered"));
    }

    #[test]
    fn uuids_and_unique_prefixes() {
        assert_eq!(uuid_text(&B), "GPU-bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb");
        // Bytes in order, grouped 4-2-2-2-6 (as NVML writes them too).
        let ordered: [u8; 16] = std::array::from_fn(|i| i as u8);
        assert_eq!(
            uuid_text(&ordered),
            "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
        );
        assert_eq!(chosen("GPU-bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb,0"), [1, 0]);
        assert_eq!(chosen("gpu-BBB"), [1]);
        assert_eq!(chosen("GPU-ab"), [2]);
        // `GPU-a` is the start of two uuids: the list ends there.
        let s = select("2,GPU-a,0", &[A, B, C]);
        assert_eq!(s.chosen, [2]);
        assert!(s.stopped.unwrap().contains("several"));
        assert!(select("GPU-cc", &[A, B, C])
            .stopped
            .unwrap()
            .contains("no device"));
        assert!(select("MIG-1234", &[A]).stopped.unwrap().contains("MIG"));
        assert_eq!(chosen("GPU-"), Vec::<usize>::new());
    }

    #[test]
    fn long_lists_are_cut_at_an_entry() {
        let long = vec!["1"; 1000].join(",");
        let cut = cut(&long);
        assert!(cut.len() <= MAX_TEXT_BYTES && cut.ends_with('1'));
        assert_eq!(super::cut("0,1"), "0,1");
    }
}
