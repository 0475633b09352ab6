//! Positioned reads of regular files, and the errors they report: a short read of a file that
//! shrank is [`Error::LengthChanged`], never a signal.

use std::fs::File;
use std::io;

use crate::error::{Error, Result};

/// Opens a regular file for reading and returns it with its status.
pub(crate) fn open_regular(path: &str) -> Result<(File, std::fs::Metadata)> {
    // stat before open: opening a FIFO (or a device) for reading can block forever.
    let kind = std::fs::metadata(path)
        .map_err(|e| Error::data(path, "data file", format!("cannot be inspected ({e})")))?;
    if !kind.is_file() {
        return Err(Error::data(path, "data file", "is not a regular file"));
    }
    let file = File::open(path).map_err(|e| {
        let msg = if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
            format!(
                "cannot be opened: no file descriptor is left ({e}); raise the open-file \
                 limit (ulimit -n) or lower max_open_files"
            )
        } else {
            format!("cannot be opened ({e})")
        };
        Error::data(path, "data file", msg)
    })?;
    let meta = file
        .metadata()
        .map_err(|e| Error::data(path, "data file", format!("cannot be inspected ({e})")))?;
    if !meta.is_file() {
        return Err(Error::data(path, "data file", "is not a regular file"));
    }
    Ok((file, meta))
}

/// `pread` until `buf` is full; `UnexpectedEof` when the file ends first.
pub(crate) fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
    }
    #[cfg(windows)]
    {
        use std::os::windows::fs::FileExt;
        let (mut buf, mut offset) = (buf, offset);
        while !buf.is_empty() {
            match file.seek_read(buf, offset) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    let rest = buf;
                    buf = &mut rest[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The error of a failed read of `path`, which had `expected` bytes when opened: a short read
/// (the file shrank) is `LengthChanged` with the length it has now.
pub(crate) fn read_error(path: &str, file: &File, expected: u64, e: io::Error) -> Error {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        if let Ok(m) = file.metadata() {
            return Error::LengthChanged {
                file: path.to_owned(),
                expected,
                found: m.len(),
            };
        }
    }
    Error::data(path, "data file", format!("cannot be read ({e})"))
}
