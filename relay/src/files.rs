//! Files the relay reads (its config, its token): each read whole, but
//! never past a bound, so that a huge file, or a device that never ends,
//! costs at most the bound and is refused with a message saying so.

use std::io::Read;
use std::path::Path;

/// The text of `path`, refused when it holds more than `max` bytes (read
/// one byte past the bound: a file growing meanwhile is caught too).
/// `kind` names the bound in the error ("a token file"); the caller names
/// the file.
pub fn read_bounded(path: &Path, max: usize, kind: &str) -> Result<String, String> {
    let cannot = |e: std::io::Error| format!("cannot be read: {e}");
    let file = std::fs::File::open(path).map_err(cannot)?;
    let mut bytes = Vec::new();
    file.take(max as u64 + 1).read_to_end(&mut bytes).map_err(cannot)?;
    if bytes.len() > max {
        return Err(match std::fs::metadata(path) {
            Ok(m) if m.len() > max as u64 => format!("is {} bytes, above the bound of {max} on {kind}", m.len()),
            _ => format!("holds more than the bound of {max} bytes on {kind}"),
        });
    }
    String::from_utf8(bytes).map_err(|e| format!("cannot be read: not UTF-8 ({e})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_read_up_to_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "abcd").unwrap();
        assert_eq!(read_bounded(&path, 4, "f").unwrap(), "abcd");
        assert_eq!(
            read_bounded(&path, 3, "a test file").unwrap_err(),
            "is 4 bytes, above the bound of 3 on a test file"
        );
        // A device that never ends: read to the bound, then refused.
        assert_eq!(
            read_bounded(Path::new("/dev/zero"), 1000, "a device").unwrap_err(),
            "holds more than the bound of 1000 bytes on a device"
        );
        assert!(read_bounded(&dir.path().join("none"), 10, "f").unwrap_err().starts_with("cannot be read: "));
    }
}
