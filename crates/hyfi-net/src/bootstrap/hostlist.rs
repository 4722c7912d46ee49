//! Slurm host lists: the first host of `node[01-04,07],gpu3` and friends,
//! where node 0 of an `srun` step listens.

/// Why a Slurm host list could not be read.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct BadHostlist(&'static str);

/// The first host of a Slurm host list (`node[01-04,07],gpu3` → `node01`).
///
/// The whole list is checked, not only its first entry, so a malformed list
/// is reported rather than half-used. A host list is a comma-separated list of
/// entries; an entry is text with bracketed range groups (`rack[1-2]-n[01-16]`),
/// a group is a comma-separated list of numbers or `lo-hi` ranges, and a
/// number keeps its leading zeros (Slurm pads to the width of `lo`).
pub(super) fn first_host(list: &str) -> Result<String, BadHostlist> {
    let list = list.trim();
    let mut first = None;
    for entry in split_top_level(list)? {
        let host = first_of_entry(entry)?;
        first.get_or_insert(host);
    }
    first.ok_or(BadHostlist("empty host list"))
}

/// Splits at commas outside brackets.
fn split_top_level(list: &str) -> Result<Vec<&str>, BadHostlist> {
    let mut entries = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err(BadHostlist("nested '['")),
            ']' if depth == 1 => depth = 0,
            ']' => return Err(BadHostlist("']' without '['")),
            ',' if depth == 0 => {
                entries.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(BadHostlist("'[' without ']'"));
    }
    entries.push(&list[start..]);
    if entries.iter().any(|e| e.trim().is_empty()) {
        return Err(BadHostlist("empty entry"));
    }
    Ok(entries)
}

/// The first host an entry (`rack[1-2]-n[01-16]`) expands to, checking the
/// entry's ranges.
fn first_of_entry(entry: &str) -> Result<String, BadHostlist> {
    let entry = entry.trim();
    let mut host = String::new();
    let mut rest = entry;
    while let Some(open) = rest.find('[') {
        let text = &rest[..open];
        check_text(text)?;
        host.push_str(text);
        let close = rest[open..]
            .find(']')
            .map(|c| open + c)
            .ok_or(BadHostlist("'[' without ']'"))?;
        host.push_str(first_of_group(&rest[open + 1..close])?);
        rest = &rest[close + 1..];
    }
    check_text(rest)?;
    host.push_str(rest);
    Ok(host)
}

fn check_text(text: &str) -> Result<(), BadHostlist> {
    if text.chars().any(|c| c.is_whitespace() || c == ']') {
        Err(BadHostlist("unexpected character in a host name"))
    } else {
        Ok(())
    }
}

/// The first number of a range group (`01-04,07` → `01`), checking the group.
fn first_of_group(group: &str) -> Result<&str, BadHostlist> {
    let mut first = None;
    for range in group.split(',') {
        let (lo, hi) = range.split_once('-').unwrap_or((range, range));
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(lo) || !digits(hi) {
            return Err(BadHostlist("a range must be N or LO-HI, in decimal digits"));
        }
        // Compare as numbers of any length: strip zeros, then longer is
        // larger, then lexicographic.
        let (l, h) = (lo.trim_start_matches('0'), hi.trim_start_matches('0'));
        if (l.len(), l) > (h.len(), h) {
            return Err(BadHostlist("a range's low end is above its high end"));
        }
        first.get_or_insert(lo);
    }
    first.ok_or(BadHostlist("empty '[]'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostlist_first_host() {
        let cases = [
            ("node01", "node01"),
            ("node[01-04]", "node01"),
            ("node[1,3-5]", "node1"),
            ("a[1-2],b3", "a1"),
            ("rack1-node[001-003]", "rack1-node001"),
            ("rack[1-2]-node[07-09]", "rack1-node07"),
            ("node[0009-0012]", "node0009"),
            ("n[9-10]", "n9"),
            (" c1 ", "c1"),
            ("x[5]", "x5"),
            ("b3,a[1-2]", "b3"),
        ];
        for (list, first) in cases {
            assert_eq!(first_host(list), Ok(first.to_string()), "{list}");
        }
    }

    #[test]
    fn hostlist_errors() {
        let cases = [
            ("", "empty entry"),
            ("node[1-", "'[' without ']'"),
            ("node1]", "']' without '['"),
            ("node[[1]]", "nested '['"),
            ("node[]", "a range must be N or LO-HI, in decimal digits"),
            ("node[a-b]", "a range must be N or LO-HI, in decimal digits"),
            (
                "node[1-2-3]",
                "a range must be N or LO-HI, in decimal digits",
            ),
            ("node[5-3]", "a range's low end is above its high end"),
            ("a1,,b2", "empty entry"),
            ("a1,b[9-1]", "a range's low end is above its high end"),
            ("a b", "unexpected character in a host name"),
        ];
        for (list, why) in cases {
            assert_eq!(first_host(list), Err(BadHostlist(why)), "{list}");
        }
    }
}
