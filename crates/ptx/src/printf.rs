//! Device `printf` (`vprintf`): formats a C format string against the packed
//! argument buffer the compiler builds (each argument aligned to its size,
//! floats promoted to double).

/// Formats `fmt` with arguments fetched by `arg(offset, size)` from the
/// argument buffer. Returns the produced bytes.
pub(crate) fn format(
    fmt: &[u8],
    mut arg: impl FnMut(u64, u32) -> Option<u64>,
    mut string_at: impl FnMut(u64) -> Option<Vec<u8>>,
) -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 0usize;
    let mut off = 0u64;
    let mut next = |size: u32, off: &mut u64| -> Option<u64> {
        let a = *off;
        let a = a.div_ceil(size as u64) * size as u64;
        *off = a + size as u64;
        arg(a, size)
    };
    while i < fmt.len() {
        let c = fmt[i];
        if c != b'%' {
            out.push(c);
            i += 1;
            continue;
        }
        let start = i;
        i += 1;
        // flags
        let mut left = false;
        let mut plus = false;
        let mut space = false;
        let mut alt = false;
        let mut zero = false;
        while i < fmt.len() {
            match fmt[i] {
                b'-' => left = true,
                b'+' => plus = true,
                b' ' => space = true,
                b'#' => alt = true,
                b'0' => zero = true,
                _ => break,
            }
            i += 1;
        }
        let mut width: Option<usize> = None;
        if i < fmt.len() && fmt[i] == b'*' {
            width = next(4, &mut off).map(|v| (v as i32).unsigned_abs() as usize);
            i += 1;
        }
        while i < fmt.len() && fmt[i].is_ascii_digit() {
            width = Some(
                width
                    .unwrap_or(0)
                    .saturating_mul(10)
                    .saturating_add((fmt[i] - b'0') as usize)
                    .min(4096),
            );
            i += 1;
        }
        let mut prec: Option<usize> = None;
        if i < fmt.len() && fmt[i] == b'.' {
            i += 1;
            prec = Some(0);
            if i < fmt.len() && fmt[i] == b'*' {
                prec = next(4, &mut off).map(|v| (v as i32).max(0) as usize);
                i += 1;
            }
            while i < fmt.len() && fmt[i].is_ascii_digit() {
                prec = Some(
                    prec.unwrap_or(0)
                        .saturating_mul(10)
                        .saturating_add((fmt[i] - b'0') as usize)
                        .min(4096),
                );
                i += 1;
            }
        }
        // length
        let mut long = 0u8;
        while i < fmt.len() && matches!(fmt[i], b'l' | b'h' | b'z' | b'j' | b't' | b'L' | b'q') {
            if matches!(fmt[i], b'l' | b'z' | b'j' | b't' | b'L' | b'q') {
                long += 1;
            }
            i += 1;
        }
        let Some(&conv) = fmt.get(i) else {
            out.extend_from_slice(&fmt[start..]);
            break;
        };
        i += 1;
        let size = if long > 0 { 8 } else { 4 };
        let body: Vec<u8>;
        let mut numeric = true;
        let mut sign = String::new();
        match conv {
            b'%' => {
                out.push(b'%');
                continue;
            }
            b'd' | b'i' => {
                let v = next(size, &mut off).unwrap_or(0);
                let v = if size == 4 {
                    v as u32 as i32 as i64
                } else {
                    v as i64
                };
                if v < 0 {
                    sign.push('-');
                } else if plus {
                    sign.push('+');
                } else if space {
                    sign.push(' ');
                }
                let mut s = v.unsigned_abs().to_string();
                if let Some(p) = prec {
                    if p == 0 && v == 0 {
                        s.clear();
                    }
                    while s.len() < p {
                        s.insert(0, '0');
                    }
                }
                body = s.into_bytes();
            }
            b'u' | b'x' | b'X' | b'o' => {
                let v = next(size, &mut off).unwrap_or(0);
                let v = if size == 4 { v & 0xffff_ffff } else { v };
                let mut s = match conv {
                    b'u' => v.to_string(),
                    b'x' => format!("{v:x}"),
                    b'X' => format!("{v:X}"),
                    _ => format!("{v:o}"),
                };
                if let Some(p) = prec {
                    if p == 0 && v == 0 {
                        s.clear();
                    }
                    while s.len() < p {
                        s.insert(0, '0');
                    }
                }
                if alt && v != 0 {
                    match conv {
                        b'x' => sign.push_str("0x"),
                        b'X' => sign.push_str("0X"),
                        b'o' => s.insert(0, '0'),
                        _ => {}
                    }
                }
                body = s.into_bytes();
            }
            b'c' => {
                let v = next(4, &mut off).unwrap_or(0);
                body = vec![v as u8];
                numeric = false;
            }
            b's' => {
                let p = next(8, &mut off).unwrap_or(0);
                let mut s = if p == 0 {
                    b"(null)".to_vec()
                } else {
                    string_at(p).unwrap_or_else(|| b"(bad string)".to_vec())
                };
                if let Some(pr) = prec {
                    s.truncate(pr);
                }
                body = s;
                numeric = false;
            }
            b'p' => {
                let v = next(8, &mut off).unwrap_or(0);
                body = format!("0x{v:x}").into_bytes();
                numeric = false;
            }
            b'f' | b'F' | b'e' | b'E' | b'g' | b'G' | b'a' | b'A' => {
                let v = f64::from_bits(next(8, &mut off).unwrap_or(0));
                if v.is_sign_negative() && !v.is_nan() {
                    sign.push('-');
                } else if plus {
                    sign.push('+');
                } else if space {
                    sign.push(' ');
                }
                let a = v.abs();
                let upper = conv.is_ascii_uppercase();
                let s = if a.is_nan() {
                    zero = false;
                    "nan".to_string()
                } else if a.is_infinite() {
                    zero = false;
                    "inf".to_string()
                } else {
                    let p = prec.unwrap_or(6);
                    match conv.to_ascii_lowercase() {
                        b'f' => {
                            let mut s = format!("{a:.p$}");
                            if alt && p == 0 {
                                s.push('.');
                            }
                            s
                        }
                        b'e' => fmt_exp(a, p, alt),
                        b'a' => fmt_hex(a, prec),
                        _ => fmt_g(a, p, alt),
                    }
                };
                body = if upper {
                    s.to_uppercase().into_bytes()
                } else {
                    s.into_bytes()
                };
            }
            _ => {
                out.extend_from_slice(&fmt[start..i]);
                continue;
            }
        }
        let len = sign.len() + body.len();
        let pad = width.unwrap_or(0).saturating_sub(len);
        if left {
            out.extend_from_slice(sign.as_bytes());
            out.extend_from_slice(&body);
            out.extend(std::iter::repeat_n(b' ', pad));
        } else if zero
            && numeric
            && (prec.is_none() || matches!(conv, b'f' | b'F' | b'e' | b'E' | b'g' | b'G'))
        {
            out.extend_from_slice(sign.as_bytes());
            out.extend(std::iter::repeat_n(b'0', pad));
            out.extend_from_slice(&body);
        } else {
            out.extend(std::iter::repeat_n(b' ', pad));
            out.extend_from_slice(sign.as_bytes());
            out.extend_from_slice(&body);
        }
    }
    out
}

/// `%a` formatting of a non-negative finite value: 0x1.hhhp±d.
fn fmt_hex(a: f64, prec: Option<usize>) -> String {
    if a == 0.0 {
        return match prec {
            Some(p) if p > 0 => format!("0x0.{}p+0", "0".repeat(p)),
            _ => "0x0p+0".into(),
        };
    }
    let bits = a.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i64;
    let mut mant = bits & ((1u64 << 52) - 1);
    let (mut lead, exp) = if biased == 0 {
        (0u64, -1022)
    } else {
        (1u64, biased - 1023)
    };
    let digits = match prec {
        Some(p) if p < 13 => {
            // round the 52-bit fraction to p hex digits, ties to even
            let drop = 4 * (13 - p as u32);
            let rem = mant & ((1u64 << drop) - 1);
            let half = 1u64 << (drop - 1);
            mant >>= drop;
            if rem > half || (rem == half && mant & 1 == 1) {
                mant += 1;
                if p == 0 || mant >> (4 * p as u32) != 0 {
                    lead += 1;
                    mant &= (1u64 << (4 * p as u32)).wrapping_sub(1);
                }
            }
            if p == 0 {
                String::new()
            } else {
                format!("{mant:0w$x}", w = p)
            }
        }
        Some(p) => format!("{mant:013x}{}", "0".repeat(p - 13)),
        None => format!("{mant:013x}").trim_end_matches('0').to_string(),
    };
    if digits.is_empty() {
        format!("0x{lead}p{exp:+}")
    } else {
        format!("0x{lead}.{digits}p{exp:+}")
    }
}

/// `%e` formatting: d.ddddde±XX.
fn fmt_exp(a: f64, p: usize, alt: bool) -> String {
    let s = format!("{a:.p$e}");
    let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let e: i32 = exp.parse().unwrap_or(0);
    let mut m = mant.to_string();
    if alt && p == 0 {
        m.push('.');
    }
    format!(
        "{m}e{}{:02}",
        if e < 0 { '-' } else { '+' },
        e.unsigned_abs()
    )
}

/// `%g` formatting: shortest of %e/%f with trailing zeros removed.
fn fmt_g(a: f64, p: usize, alt: bool) -> String {
    let p = if p == 0 { 1 } else { p };
    if a == 0.0 {
        return if alt {
            format!("{:.*}", p - 1, 0.0)
        } else {
            "0".into()
        };
    }
    let s = format!("{:.*e}", p - 1, a);
    let exp: i32 = s
        .split_once('e')
        .and_then(|(_, e)| e.parse().ok())
        .unwrap_or(0);
    let mut r = if exp < -4 || exp >= p as i32 {
        fmt_exp(a, p - 1, alt)
    } else {
        let decimals = (p as i32 - 1 - exp).max(0) as usize;
        format!("{a:.decimals$}")
    };
    if !alt {
        if let Some(epos) = r.find('e') {
            let (m, e) = r.split_at(epos);
            let mut m = m.to_string();
            if m.contains('.') {
                while m.ends_with('0') {
                    m.pop();
                }
                if m.ends_with('.') {
                    m.pop();
                }
            }
            r = format!("{m}{e}");
        } else if r.contains('.') {
            while r.ends_with('0') {
                r.pop();
            }
            if r.ends_with('.') {
                r.pop();
            }
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::format;

    /// Formats with arguments packed like nvcc does (each aligned to its size).
    fn fmt(f: &str, args: &[(u64, u32)]) -> String {
        let mut buf = Vec::new();
        for &(v, size) in args {
            while buf.len() % size as usize != 0 {
                buf.push(0);
            }
            buf.extend_from_slice(&v.to_le_bytes()[..size as usize]);
        }
        let out = format(
            f.as_bytes(),
            |off, size| {
                let o = off as usize;
                let b = buf.get(o..o + size as usize)?;
                let mut w = [0u8; 8];
                w[..b.len()].copy_from_slice(b);
                Some(u64::from_le_bytes(w))
            },
            |p| Some(format!("str{p}").into_bytes()),
        );
        String::from_utf8(out).unwrap()
    }

    fn d(x: f64) -> (u64, u32) {
        (x.to_bits(), 8)
    }

    #[test]
    fn integers() {
        assert_eq!(
            fmt(
                "%d|%i|%u",
                &[(-5i32 as u32 as u64, 4), (7, 4), (u32::MAX as u64, 4)]
            ),
            "-5|7|4294967295"
        );
        assert_eq!(
            fmt(
                "%4d|%-4d|%04d|%+d|% d",
                &[(3, 4), (3, 4), (3, 4), (3, 4), (3, 4)]
            ),
            "   3|3   |0003|+3| 3"
        );
        assert_eq!(
            fmt(
                "%x|%X|%#x|%o|%#o",
                &[(255, 4), (255, 4), (255, 4), (8, 4), (8, 4)]
            ),
            "ff|FF|0xff|10|010"
        );
        assert_eq!(
            fmt(
                "%ld|%lld|%llu|%lx",
                &[(u64::MAX, 8), (1 << 40, 8), (u64::MAX, 8), (1 << 40, 8)]
            ),
            "-1|1099511627776|18446744073709551615|10000000000"
        );
        assert_eq!(
            fmt("%.3d|%.0d|%5.3d", &[(7, 4), (0, 4), (7, 4)]),
            "007||  007"
        );
        assert_eq!(fmt("%c%c", &[(72, 4), (105, 4)]), "Hi");
    }

    #[test]
    fn mixed_alignment() {
        // int then double: the double sits at offset 8
        assert_eq!(fmt("%d %f", &[(1, 4), d(2.5)]), "1 2.500000");
        assert_eq!(
            fmt("%s|%.2s|%p", &[(16, 8), (32, 8), (0xabc, 8)]),
            "str16|st|0xabc"
        );
    }

    #[test]
    fn floats() {
        assert_eq!(
            fmt(
                "%f|%.2f|%8.3f|%-8.1f|%+.1f",
                &[d(1.5), d(2.345), d(-3.14149), d(2.0), d(2.0)]
            ),
            "1.500000|2.35|  -3.141|2.0     |+2.0"
        );
        assert_eq!(
            fmt(
                "%e|%.2E|%g|%g|%g|%g",
                &[
                    d(12345.678),
                    d(0.000123),
                    d(100000.0),
                    d(1000000.0),
                    d(0.0001),
                    d(0.00001)
                ]
            ),
            "1.234568e+04|1.23E-04|100000|1e+06|0.0001|1e-05"
        );
        assert_eq!(
            fmt("%g|%.3g|%#g|%G", &[d(0.5), d(2.71349), d(1.0), d(1e-10)]),
            "0.5|2.71|1.00000|1E-10"
        );
        assert_eq!(
            fmt(
                "%f|%f|%f|%5.1f",
                &[d(f64::INFINITY), d(-f64::INFINITY), d(f64::NAN), d(0.05)]
            ),
            "inf|-inf|nan|  0.1"
        );
        assert_eq!(fmt("%08.3f|%g", &[d(-1.5), d(0.0)]), "-001.500|0");
        // `%#.0f` and `%a` of 1.0 as an H100 prints them; the rest as glibc does
        assert_eq!(
            fmt(
                "%.0f|%#.0f|%a|%a|%a|%.1a",
                &[d(2.5), d(2.5), d(1.0), d(3.0), d(-0.1), d(1.96875)]
            ),
            "2|2.|0x1p+0|0x1.8p+1|-0x1.999999999999ap-4|0x2.0p+0"
        );
    }

    #[test]
    fn odd_formats() {
        assert_eq!(fmt("100%%", &[]), "100%");
        assert_eq!(fmt("%q|%", &[]), "%q|%");
        assert_eq!(
            fmt("%*d|%.*f", &[(5, 4), (42, 4), (2, 4), d(1.0)]),
            "   42|1.00"
        );
        assert_eq!(fmt("%d %d", &[(1, 4)]), "1 0");
    }
}
