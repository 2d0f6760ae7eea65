//! Glob patterns for configuration: `*` matches any run of characters (including none),
//! `?` exactly one; everything else matches itself. `room:news-*` matches `room:news-eu`.
//!
//! First-party plugins use it for room and conversation rules; it is here so every plugin
//! reads patterns the same way.

/// Whether `text` matches the glob `pattern`, in O(len(pattern) × len(text)) worst case
/// and no allocation.
pub fn matches(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    // Where the last `*` was and which text position it is currently standing for.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if c == b'?' || c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// The first of `patterns` that `text` matches, with its index.
pub fn first_match<'a, I, S>(patterns: I, text: &str) -> Option<usize>
where
    I: IntoIterator<Item = &'a S>,
    S: AsRef<str> + 'a + ?Sized,
{
    patterns.into_iter().position(|p| matches(p.as_ref(), text))
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn star_and_question_mark() {
        assert!(matches("room:*", "room:lobby"));
        assert!(matches("room:*", "room:"));
        assert!(matches("*", ""));
        assert!(matches("room:s?-*", "room:s1-lobby"));
        assert!(!matches("room:s?-*", "room:s12-lobby"));
        assert!(matches("room:*-lobby", "room:s12-lobby"));
        assert!(matches("*a*b*c", "xxaxxbxxc"));
        assert!(!matches("room:*", "dm:a:b"));
        assert!(!matches("abc", "abcd"));
        assert!(matches("a*", "a"));
    }
}
