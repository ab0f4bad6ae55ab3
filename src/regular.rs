//! Files read from paths the user gives (policies, recordings): regular files only. A FIFO,
//! a device (`/dev/zero`), a socket or a directory is refused before anything is read from
//! it: opening is non-blocking, so a FIFO without a writer cannot hang the caller.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// A path that could not be opened as a regular file.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("not a regular file (it is {0}); only a regular file is read")]
    NotRegular(&'static str),
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// What kind of file a non-regular one is, for the message.
fn kind(file_type: std::fs::FileType) -> &'static str {
    if file_type.is_dir() {
        "a directory"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_socket() {
        "a socket"
    } else {
        "not a plain file"
    }
}

/// Opens `path` for reading if it is a regular file (after symlinks); returns it and its size.
pub fn open(path: &Path) -> Result<(File, u64), OpenError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    // The file opened, not the path again: no race with a rename in between.
    let metadata = file.metadata()?;
    if !metadata.file_type().is_file() {
        return Err(OpenError::NotRegular(kind(metadata.file_type())));
    }
    Ok((file, metadata.len()))
}

/// Reads `path`, a regular file of at most `max` bytes, as UTF-8. `Ok(Err(size))`: it is larger
/// (its size, or `max + 1` when it grew while read).
pub fn read_bounded(path: &Path, max: u64) -> Result<Result<String, u64>, OpenError> {
    use std::io::Read;
    let (file, len) = open(path)?;
    if len > max {
        return Ok(Err(len));
    }
    let mut text = String::with_capacity(len as usize);
    file.take(max + 1).read_to_string(&mut text)?;
    if text.len() as u64 > max {
        return Ok(Err(text.len() as u64));
    }
    Ok(Ok(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_and_directories_are_refused() {
        for (path, what) in [("/dev/zero", "a character device"), ("/", "a directory")] {
            match open(Path::new(path)) {
                Err(OpenError::NotRegular(kind)) => assert_eq!(kind, what),
                other => panic!("{path}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_file_over_the_bound_is_its_size() {
        let path = std::env::temp_dir().join(format!("mcp-budget-regular-{}", std::process::id()));
        std::fs::write(&path, "0123456789").unwrap();
        assert_eq!(
            read_bounded(&path, 10).unwrap(),
            Ok("0123456789".to_string())
        );
        assert_eq!(read_bounded(&path, 9).unwrap(), Err(10));
        let _ = std::fs::remove_file(&path);
    }
}
