//! The Jinja environment of Hugging Face chat templates, in `minijinja`.
//!
//! transformers' `_compile_jinja_template` renders chat templates with jinja2's
//! `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` (jinja2's default
//! `keep_trailing_newline=False`, the `loopcontrols` extension), its own `tojson` filter
//! (`json.dumps(x, ensure_ascii=False, indent=indent, separators=separators,
//! sort_keys=sort_keys)`), and the globals `raise_exception(message)` and
//! `strftime_now(format)`. [`environment`] sets up the same in `minijinja`, plus what makes
//! Python templates behave as under jinja2:
//! - Python's string, dict and list methods (`.strip()`, `.startswith()`, `.items()`, ...)
//!   through `minijinja_contrib::pycompat`;
//! - `None`, `True` and `False` printed as Python prints them (minijinja prints `none`,
//!   `true`, `false`);
//! - no autoescaping.
//!
//! Known differences: `strftime_now` formats the current time in UTC (Python's
//! `datetime.now()` is local time); lists and dicts printed directly (not through `tojson`)
//! use minijinja's notation, not Python's `repr`; the `{% generation %}` tag of
//! transformers' assistant-mask extension is not known.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, Output, State};

/// A `minijinja` environment set up as transformers sets up jinja2 for chat templates (see
/// the module docs), without templates.
pub(crate) fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(python_formatter);
    env.add_filter("tojson", tojson);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env
}

/// Prints `None`, `True` and `False` as Python does; everything else as minijinja does.
fn python_formatter(out: &mut Output, state: &State, value: &Value) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => Ok(out.write_str("None")?),
        ValueKind::Bool => Ok(out.write_str(if value.is_true() { "True" } else { "False" })?),
        _ => minijinja::escape_formatter(out, state, value),
    }
}

/// transformers' `raise_exception(message)`: fails the rendering with the template's message.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("raise_exception: {message}"),
    ))
}

/// How [`tojson`] lays out JSON (Python's `json.dumps` arguments).
struct JsonStyle {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

/// transformers' `tojson` filter: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, with the same keyword arguments (and the first three
/// positionally; minijinja takes at most five arguments per filter). Keys
/// keep their order; separators default to `", "` and `": "` (`","` and `": "` with an
/// indent); non-ASCII characters are written as they are unless `ensure_ascii`; nothing is
/// HTML-escaped (unlike jinja2's and minijinja's own `tojson`).
fn tojson(
    value: &Value,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    separators: Option<Value>,
    kwargs: Kwargs,
) -> Result<String, Error> {
    let pick = |pos: Option<Value>, key: &str| -> Result<Option<Value>, Error> {
        let kw: Option<Value> = kwargs.get(key)?;
        Ok(pos.or(kw).filter(|v| !v.is_none() && !v.is_undefined()))
    };
    let ensure_ascii = pick(ensure_ascii, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let sort_keys = pick(None, "sort_keys")?.is_some_and(|v| v.is_true());
    let indent = match pick(indent, "indent")? {
        None => None,
        Some(v) => Some(match (v.as_str(), v.as_i64()) {
            (Some(s), _) => s.to_string(),
            (None, Some(n)) => " ".repeat(usize::try_from(n).unwrap_or(0)),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: indent must be an integer or a string, not {v}"),
                ))
            }
        }),
    };
    let (item_sep, key_sep) = match pick(separators, "separators")? {
        Some(v) => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                    (a.to_string(), b.to_string())
                }
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    ))
                }
            }
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    kwargs.assert_all_used()?;
    let style = JsonStyle {
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
        sort_keys,
    };
    let mut out = String::new();
    write_json(&mut out, value, &style, 0)?;
    Ok(out)
}

fn not_json(kind: ValueKind) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("tojson: a value of type {kind} is not JSON serializable"),
    )
}

fn write_json(out: &mut String, v: &Value, style: &JsonStyle, level: usize) -> Result<(), Error> {
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number if v.is_integer() => out.push_str(&v.to_string()),
        ValueKind::Number => {
            let x = f64::try_from(v.clone())?;
            out.push_str(&python_float(x));
        }
        ValueKind::String => write_json_str(out, v.as_str().unwrap_or_default(), style),
        ValueKind::Seq => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_container(out, '[', ']', &items, style, level, |out, item, lvl| {
                write_json(out, item, style, lvl)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<(String, Value)> = v
                .try_iter()?
                .map(|k| Ok((json_key(&k)?, k)))
                .collect::<Result<_, Error>>()?;
            if style.sort_keys {
                keys.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, '{', '}', &keys, style, level, |out, (name, k), lvl| {
                write_json_str(out, name, style);
                out.push_str(&style.key_sep);
                write_json(out, &v.get_item(k)?, style, lvl)
            })?;
        }
        other => return Err(not_json(other)),
    }
    Ok(())
}

/// A map key as `json.dumps` writes it: strings as they are, numbers, bools and `None` as
/// their JSON text.
fn json_key(k: &Value) -> Result<String, Error> {
    match k.kind() {
        ValueKind::String => Ok(k.as_str().unwrap_or_default().to_string()),
        ValueKind::None => Ok("null".into()),
        ValueKind::Bool | ValueKind::Number => {
            let mut s = String::new();
            write_json(
                &mut s,
                k,
                &JsonStyle {
                    ensure_ascii: false,
                    indent: None,
                    item_sep: String::new(),
                    key_sep: String::new(),
                    sort_keys: false,
                },
                0,
            )?;
            Ok(s)
        }
        other => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: keys must be str, int, float, bool or None, not {other}"),
        )),
    }
}

fn write_container<T>(
    out: &mut String,
    open: char,
    close: char,
    items: &[T],
    style: &JsonStyle,
    level: usize,
    mut each: impl FnMut(&mut String, &T, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    let newline = |out: &mut String, lvl: usize| {
        if let Some(ind) = &style.indent {
            out.push('\n');
            for _ in 0..lvl {
                out.push_str(ind);
            }
        }
    };
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&style.item_sep);
        }
        newline(out, level + 1);
        each(out, item, level + 1)?;
    }
    newline(out, level);
    out.push(close);
    Ok(())
}

/// A JSON string as Python's `json.dumps` escapes it.
fn write_json_str(out: &mut String, s: &str, style: &JsonStyle) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (style.ensure_ascii && !c.is_ascii()) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest digits that round-trip, positional from 1e-4 up to
/// 1e16 (with at least one decimal), scientific otherwise (`1e-05`, `1.5e+16`); JSON's
/// `NaN`, `Infinity`, `-Infinity` as `json.dumps` writes them.
fn python_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.2345e-7"
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let point = exp + 1; // digits before the decimal point
        let body = if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if point >= n {
            format!("{digits}{}.0", "0".repeat((point - n) as usize))
        } else {
            let (a, b) = digits.split_at(point as usize);
            format!("{a}.{b}")
        };
        format!("{sign}{body}")
    } else {
        let m = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits
        };
        let e_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{m}e{e_sign}{:02}", exp.abs())
    }
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// transformers' `strftime_now(format)` (`datetime.now().strftime(format)`), in UTC, for
/// the directives `%Y %y %m %d %e %B %b %A %a %H %I %M %S %p %j %%`.
fn strftime_now(format: String) -> Result<String, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    strftime(&format, secs)
}

/// `strftime` of a Unix time in UTC (see [`strftime_now`]).
pub(crate) fn strftime(format: &str, unix_secs: u64) -> Result<String, Error> {
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    let (hour, minute, second) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // civil_from_days (Howard Hinnant's algorithm)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let day = doy_mar - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    const BEFORE: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = BEFORE[(month - 1) as usize] + day + i64::from(leap && month > 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('Y') => write!(out, "{year}"),
            Some('y') => write!(out, "{:02}", year.rem_euclid(100)),
            Some('m') => write!(out, "{month:02}"),
            Some('d') => write!(out, "{day:02}"),
            Some('e') => write!(out, "{day:2}"),
            Some('B') => write!(out, "{month_name}"),
            Some('b') => write!(out, "{}", &month_name[..3]),
            Some('A') => write!(out, "{}", WEEKDAYS[weekday]),
            Some('a') => write!(out, "{}", &WEEKDAYS[weekday][..3]),
            Some('H') => write!(out, "{hour:02}"),
            Some('I') => write!(out, "{:02}", (hour + 11) % 12 + 1),
            Some('M') => write!(out, "{minute:02}"),
            Some('S') => write!(out, "{second:02}"),
            Some('p') => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            Some('j') => write!(out, "{yday:03}"),
            Some('%') => write!(out, "%"),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: directive %{} is not supported",
                        other.map(String::from).unwrap_or_default()
                    ),
                ))
            }
        };
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str) -> Result<String, Error> {
        environment().render_str(src, ())
    }

    #[test]
    fn floats_print_as_python_repr() {
        for (x, want) in [
            (1.5, "1.5"),
            (2.0, "2.0"),
            (-0.25, "-0.25"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (123456789.0, "123456789.0"),
            (1e16, "1e+16"),
            (1.5e300, "1.5e+300"),
            (0.1 + 0.2, "0.30000000000000004"),
            (f64::INFINITY, "Infinity"),
        ] {
            assert_eq!(python_float(x), want, "{x}");
        }
    }

    #[test]
    fn tojson_is_python_json_dumps() {
        assert_eq!(
            render(r#"{{ {"b": [1, 2.5, none, true], "a": "é<&>'\n"} | tojson }}"#).unwrap(),
            r#"{"b": [1, 2.5, null, true], "a": "é<&>'\n"}"#
        );
        assert_eq!(
            render(r#"{{ {"b": 1, "a": [], "c": {}} | tojson(indent=2, sort_keys=true) }}"#)
                .unwrap(),
            "{\n  \"a\": [],\n  \"b\": 1,\n  \"c\": {}\n}"
        );
        assert_eq!(
            render(r#"{{ ["é", "🙂"] | tojson(ensure_ascii=true, separators=[",", ":"]) }}"#)
                .unwrap(),
            r#"["\u00e9","\ud83d\ude42"]"#
        );
        assert!(render("{{ x | tojson }}").is_err());
    }

    #[test]
    fn python_values_print_as_python() {
        assert_eq!(
            render("{{ none }} {{ true }} {{ false }} {{ 1 }}").unwrap(),
            "None True False 1"
        );
        assert_eq!(render("{{ ' a '.strip() }}").unwrap(), "a");
    }

    #[test]
    fn raise_exception_fails_with_the_message() {
        let e = render("{{ raise_exception('no way') }}").unwrap_err();
        assert!(e.to_string().contains("raise_exception: no way"), "{e}");
    }

    #[test]
    fn strftime_formats_utc_dates() {
        // 2024-07-26 13:25:09 UTC, a Friday, day 208 of a leap year
        let t = 1_722_000_309;
        assert_eq!(
            strftime("%d %b %Y|%A %a|%B %m %y|%H:%M:%S %I%p|%j|%e|%%", t).unwrap(),
            "26 Jul 2024|Friday Fri|July 07 24|13:25:09 01PM|208|26|%"
        );
        assert_eq!(strftime("%Y-%m-%d", 0).unwrap(), "1970-01-01");
        assert_eq!(
            strftime("%Y-%m-%d %j", 951_782_400).unwrap(),
            "2000-02-29 060"
        );
        assert!(strftime("%Q", 0).is_err());
    }
}
