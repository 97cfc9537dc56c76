//! A small parser for Python list-of-strings literals, as `str(list_of_str)` writes them
//! (e.g. `['a', "b's"]`), following the string literal rules of the Python 3 language reference
//! ("Lexical analysis: String and Bytes literals").
//!
//! Supported: `'...'`, `"..."`, triple-quoted strings, the `r`/`R` (raw) and `u`/`U` prefixes,
//! adjacent literals concatenated (`'a' 'b'` is `'ab'`), a trailing comma, whitespace and `#`
//! comments between items, and every escape of Python 3 str literals except `\N{name}`
//! (which needs the Unicode name table): `\\ \' \" \a \b \f \n \r \t \v`, `\ooo`, `\xhh`,
//! `\uXXXX`, `\UXXXXXXXX` and backslash-newline. Unknown escapes such as `\q` keep their
//! backslash, as in Python. Lone surrogates (`\ud800`) cannot be held by a Rust `String` and are
//! reported as errors.

use crate::EvalError;

struct Parser {
    chars: Vec<char>,
    pos: usize,
}

fn err(offset: usize, message: impl Into<String>) -> EvalError {
    EvalError::PyLiteral {
        offset,
        message: message.into(),
    }
}

impl Parser {
    fn new(s: &str) -> Self {
        Parser {
            chars: s.chars().collect(),
            pos: 0,
        }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek_at(&self, k: usize) -> Option<char> {
        self.chars.get(self.pos + k).copied()
    }

    fn skip_space_and_comments(&mut self) {
        while let Some(c) = self.peek() {
            if c == '#' {
                while let Some(c) = self.peek() {
                    if c == '\n' {
                        break;
                    }
                    self.pos += 1;
                }
            } else if c.is_whitespace() || c == '\u{c}' {
                self.pos += 1;
            } else if c == '\\' && self.peek_at(1) == Some('\n') {
                self.pos += 2;
            } else {
                break;
            }
        }
    }

    /// Is a string literal (with optional prefix) starting here?
    fn at_string(&self) -> bool {
        match self.peek() {
            Some('\'' | '"') => true,
            Some('r' | 'R' | 'u' | 'U') => matches!(self.peek_at(1), Some('\'' | '"')),
            _ => false,
        }
    }

    fn string(&mut self) -> Result<String, EvalError> {
        let mut raw = false;
        match self.peek() {
            Some('r' | 'R') => {
                raw = true;
                self.pos += 1;
            }
            Some('u' | 'U') => self.pos += 1,
            _ => {}
        }
        let start = self.pos;
        let quote = match self.peek() {
            Some(q @ ('\'' | '"')) => q,
            _ => return Err(err(self.pos, "expected a string literal")),
        };
        let triple = self.peek_at(1) == Some(quote) && self.peek_at(2) == Some(quote);
        self.pos += if triple { 3 } else { 1 };
        let mut out = String::new();
        loop {
            let Some(c) = self.peek() else {
                return Err(err(start, "unterminated string literal"));
            };
            if c == quote {
                if !triple {
                    self.pos += 1;
                    return Ok(out);
                }
                if self.peek_at(1) == Some(quote) && self.peek_at(2) == Some(quote) {
                    self.pos += 3;
                    return Ok(out);
                }
                out.push(c);
                self.pos += 1;
                continue;
            }
            if c == '\n' && !triple {
                return Err(err(self.pos, "newline inside a single-quoted string"));
            }
            if c != '\\' {
                out.push(c);
                self.pos += 1;
                continue;
            }
            // A backslash.
            let Some(n) = self.peek_at(1) else {
                return Err(err(start, "unterminated string literal"));
            };
            if raw {
                // In raw strings a backslash only stops the next character from ending the
                // string; both are kept.
                out.push('\\');
                out.push(n);
                self.pos += 2;
                continue;
            }
            let esc_at = self.pos;
            self.pos += 2;
            match n {
                '\n' => {}
                '\\' => out.push('\\'),
                '\'' => out.push('\''),
                '"' => out.push('"'),
                'a' => out.push('\u{7}'),
                'b' => out.push('\u{8}'),
                'f' => out.push('\u{c}'),
                'n' => out.push('\n'),
                'r' => out.push('\r'),
                't' => out.push('\t'),
                'v' => out.push('\u{b}'),
                '0'..='7' => {
                    let mut v = n.to_digit(8).unwrap_or(0);
                    for _ in 0..2 {
                        match self.peek().and_then(|c| c.to_digit(8)) {
                            Some(d) => {
                                v = v * 8 + d;
                                self.pos += 1;
                            }
                            None => break,
                        }
                    }
                    out.push(char_from(v, esc_at)?);
                }
                'x' => out.push(self.hex_escape(2, esc_at)?),
                'u' => out.push(self.hex_escape(4, esc_at)?),
                'U' => out.push(self.hex_escape(8, esc_at)?),
                'N' => return Err(err(esc_at, "\\N{name} escapes are not supported")),
                other => {
                    out.push('\\');
                    out.push(other);
                }
            }
        }
    }

    fn hex_escape(&mut self, digits: usize, esc_at: usize) -> Result<char, EvalError> {
        let mut v: u32 = 0;
        for _ in 0..digits {
            let d = self.peek().and_then(|c| c.to_digit(16)).ok_or_else(|| {
                err(
                    esc_at,
                    format!("truncated \\x/\\u/\\U escape ({digits} hex digits expected)"),
                )
            })?;
            v = v * 16 + d;
            self.pos += 1;
        }
        char_from(v, esc_at)
    }

    /// One item: adjacent string literals, concatenated.
    fn item(&mut self) -> Result<String, EvalError> {
        let mut s = self.string()?;
        loop {
            let save = self.pos;
            self.skip_space_and_comments();
            if self.at_string() {
                s.push_str(&self.string()?);
            } else {
                self.pos = save;
                return Ok(s);
            }
        }
    }

    fn end(&mut self) -> Result<(), EvalError> {
        self.skip_space_and_comments();
        match self.peek() {
            None => Ok(()),
            Some(c) => Err(err(self.pos, format!("unexpected {c:?} after the literal"))),
        }
    }
}

fn char_from(v: u32, at: usize) -> Result<char, EvalError> {
    char::from_u32(v).ok_or_else(|| {
        err(
            at,
            format!("escape gives U+{v:04X}, which is not a Unicode scalar value"),
        )
    })
}

/// Parses a Python list of strings, e.g. `['a', "b's", '\n']`.
///
/// ```
/// let v = dustin_eval::longbench::parse_py_str_list(r#"['a', "b's", 'c\'d\n']"#).unwrap();
/// assert_eq!(v, ["a", "b's", "c'd\n"]);
/// ```
pub fn parse_py_str_list(s: &str) -> Result<Vec<String>, EvalError> {
    let mut p = Parser::new(s);
    p.skip_space_and_comments();
    if p.peek() != Some('[') {
        return Err(err(p.pos, "expected `[`"));
    }
    p.pos += 1;
    let mut items = Vec::new();
    loop {
        p.skip_space_and_comments();
        match p.peek() {
            Some(']') => {
                p.pos += 1;
                break;
            }
            None => return Err(err(p.pos, "unterminated list, expected `]`")),
            _ => {}
        }
        if !p.at_string() {
            return Err(err(p.pos, "expected a string literal or `]`"));
        }
        items.push(p.item()?);
        p.skip_space_and_comments();
        match p.peek() {
            Some(',') => p.pos += 1,
            Some(']') => {}
            None => return Err(err(p.pos, "unterminated list, expected `,` or `]`")),
            Some(c) => return Err(err(p.pos, format!("expected `,` or `]`, found {c:?}"))),
        }
    }
    p.end()?;
    Ok(items)
}

/// Parses one Python string literal (adjacent literals concatenated), e.g. `'it\'s'`.
pub fn parse_py_str(s: &str) -> Result<String, EvalError> {
    let mut p = Parser::new(s);
    p.skip_space_and_comments();
    if !p.at_string() {
        return Err(err(p.pos, "expected a string literal"));
    }
    let v = p.item()?;
    p.end()?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_quote_kinds_and_escapes() {
        // What Python's repr() writes for ['a', "b's", 'say "hi"', 'both \' and "', 'tab\t'].
        let lit = r#"['a', "b's", 'say "hi"', 'both \' and "', 'tab\t']"#;
        assert_eq!(
            parse_py_str_list(lit).unwrap(),
            ["a", "b's", "say \"hi\"", "both ' and \"", "tab\t"]
        );
    }

    #[test]
    fn numeric_escapes() {
        let lit = r"['\x41\u00e9\U0001F600\101\0', '\7']";
        assert_eq!(
            parse_py_str_list(lit).unwrap(),
            ["A\u{e9}\u{1F600}A\u{0}", "\u{7}"]
        );
    }

    #[test]
    fn unknown_escape_keeps_backslash_and_raw_strings() {
        assert_eq!(
            parse_py_str_list(r"['\q', r'\n\'']").unwrap(),
            ["\\q", "\\n\\'"]
        );
    }

    #[test]
    fn empty_list_trailing_comma_concatenation_comments() {
        assert!(parse_py_str_list(" [ ] ").unwrap().is_empty());
        assert_eq!(parse_py_str_list("['x',]").unwrap(), ["x"]);
        assert_eq!(
            parse_py_str_list("[\n 'a' \"b\"  # comment\n , u'c']").unwrap(),
            ["ab", "c"]
        );
        assert_eq!(parse_py_str_list("['''tri'ple''']").unwrap(), ["tri'ple"]);
        assert_eq!(parse_py_str_list("['line\\\ncont']").unwrap(), ["linecont"]);
    }

    #[test]
    fn errors_carry_offsets() {
        for bad in [
            "",
            "'a'",
            "['a'",
            "['a' 1]",
            "['a\n']",
            "['\\x4']",
            "['\\ud800']",
            "['a'] x",
            "[1]",
            "['\\N{BULLET}']",
        ] {
            let e = parse_py_str_list(bad).unwrap_err();
            assert!(matches!(e, EvalError::PyLiteral { .. }), "{bad:?}: {e}");
        }
        match parse_py_str_list("['a', 2]").unwrap_err() {
            EvalError::PyLiteral { offset, .. } => assert_eq!(offset, 6),
            e => panic!("{e}"),
        }
    }

    #[test]
    fn single_string() {
        assert_eq!(parse_py_str(r"'it\'s'").unwrap(), "it's");
        assert_eq!(parse_py_str(r#""a" 'b'"#).unwrap(), "ab");
        assert!(parse_py_str("['a']").is_err());
    }
}
