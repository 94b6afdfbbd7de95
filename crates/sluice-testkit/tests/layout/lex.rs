//! Rust source as tokens, just enough to read module paths: comments are
//! dropped, and a string or character literal is one token, so that
//! `"redis://..."` or `"crate::x"` in a message is never taken for a path.

/// One token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    /// An identifier or keyword (`r#type` reads as `type`).
    Ident(String),
    /// A string literal's contents, escapes left as written.
    Str(String),
    /// `::`.
    PathSep,
    /// Any other punctuation, one character; numbers, characters and
    /// lifetimes read as `'0'`, so that they cannot join a path.
    Punct(char),
}

/// The tokens of `text`.
pub fn tokens(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            i = block_comment_end(&chars, i);
        } else if c == '"' {
            let (text, end) = quoted(&chars, i + 1);
            out.push(Token::Str(text));
            i = end;
        } else if c == '\'' {
            // A character literal ('a', '\n', '\u{1F600}') or a lifetime ('a).
            if at(i + 1) == '\\' {
                i += 3;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
                while at(i).is_alphanumeric() || at(i) == '_' {
                    i += 1;
                }
            }
            out.push(Token::Punct('0'));
        } else if c.is_ascii_digit() {
            while at(i).is_alphanumeric() || at(i) == '_' {
                i += 1;
            }
            out.push(Token::Punct('0'));
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while at(i).is_alphanumeric() || at(i) == '_' {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            i = literal_or_word(&chars, word, i, &mut out);
        } else if c == ':' && at(i + 1) == ':' {
            out.push(Token::PathSep);
            i += 2;
        } else {
            out.push(Token::Punct(c));
            i += 1;
        }
    }
    out
}

/// After `word` (ending before `i`): a prefixed literal (`b"…"`, `r#"…"#`,
/// `b'x'`), a raw identifier (`r#type`) or the word itself. Returns where
/// reading goes on.
fn literal_or_word(chars: &[char], word: String, i: usize, out: &mut Vec<Token>) -> usize {
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let raw = matches!(word.as_str(), "r" | "br" | "cr");
    if raw && (at(i) == '"' || (at(i) == '#' && matches!(at(i + 1), '#' | '"'))) {
        let hashes = chars[i..].iter().take_while(|&&c| c == '#').count();
        let open = i + hashes + 1;
        let close: String = std::iter::once('"')
            .chain(std::iter::repeat_n('#', hashes))
            .collect();
        let rest: String = chars[open..].iter().collect();
        let len = rest.find(&close).unwrap_or(rest.len());
        out.push(Token::Str(rest[..len].to_owned()));
        return open + rest[..len].chars().count() + close.chars().count();
    }
    if matches!(word.as_str(), "b" | "c") && at(i) == '"' {
        let (text, end) = quoted(chars, i + 1);
        out.push(Token::Str(text));
        return end;
    }
    if word == "b" && at(i) == '\'' {
        let mut j = i + 1;
        if at(j) == '\\' {
            j += 1;
        }
        j += 1;
        while j < chars.len() && chars[j] != '\'' {
            j += 1;
        }
        out.push(Token::Punct('0'));
        return j + 1;
    }
    if word == "r" && at(i) == '#' {
        let start = i + 1;
        let mut j = start;
        while at(j).is_alphanumeric() || at(j) == '_' {
            j += 1;
        }
        out.push(Token::Ident(chars[start..j].iter().collect()));
        return j;
    }
    out.push(Token::Ident(word));
    i
}

/// The contents of a `"…"` literal opening before `start`, and where it
/// ends (past the closing quote).
fn quoted(chars: &[char], start: usize) -> (String, usize) {
    let mut i = start;
    while i < chars.len() && chars[i] != '"' {
        i += if chars[i] == '\\' { 2 } else { 1 };
    }
    let end = i.min(chars.len());
    (chars[start..end].iter().collect(), end + 1)
}

/// Past the end of the (nested) block comment that opens at `start`.
fn block_comment_end(chars: &[char], start: usize) -> usize {
    let mut depth = 0;
    let mut i = start;
    while i + 1 < chars.len() {
        match (chars[i], chars[i + 1]) {
            ('/', '*') => {
                depth += 1;
                i += 2;
            }
            ('*', '/') => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return i;
                }
            }
            _ => i += 1,
        }
    }
    chars.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idents(text: &str) -> Vec<String> {
        tokens(text)
            .into_iter()
            .filter_map(|t| match t {
                Token::Ident(word) => Some(word),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn comments_and_literals_hide_what_they_hold() {
        let text = r####"
            // use crate::a;
            /* use crate::b; /* nested */ use crate::c; */
            let url = "redis://host/crate::d";
            let raw = r#"crate::e "quoted""#;
            let bytes = b"crate::f";
            let c = '"'; let e = '\''; let l: &'static str = "";
            use crate::g;
        "####;
        assert_eq!(
            idents(text),
            [
                "let", "url", "let", "raw", "let", "bytes", "let", "c", "let", "e", "let", "l",
                "str"
            ]
            .into_iter()
            .chain(["use", "crate", "g"])
            .collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_path_separator_is_one_token() {
        assert_eq!(
            tokens("super::x"),
            [
                Token::Ident("super".into()),
                Token::PathSep,
                Token::Ident("x".into())
            ]
        );
    }
}
