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
                        b'f' => format!("{a:.p$}"),
                        b'e' => fmt_exp(a, p, alt),
                        b'a' => format!("{a:e}"),
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
