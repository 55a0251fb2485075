//! The one error type of this crate: a path and what went wrong with it,
//! displayed as `path: message` (e.g. `/x/y: Permission denied (os error 13)`),
//! ready to be shown to a person as one line.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// Something went wrong with one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileError {
    pub path: PathBuf,
    pub message: String,
}

impl FileError {
    /// An error with a message of our own.
    pub fn new(path: impl Into<PathBuf>, message: impl Into<String>) -> FileError {
        FileError {
            path: path.into(),
            message: message.into(),
        }
    }

    /// An operating-system error on `path` (the message is the OS's, with its number).
    pub fn io(path: &Path, error: &io::Error) -> FileError {
        FileError::new(path, error.to_string())
    }

    /// The OS error number, when the message came from one.
    pub fn raw_os_error(&self) -> Option<i32> {
        let start = self.message.rfind("(os error ")? + "(os error ".len();
        let end = self.message[start..].find(')')? + start;
        self.message[start..end].parse().ok()
    }
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.message)
    }
}

impl std::error::Error for FileError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_path_and_os_error() {
        let e = FileError::io(
            Path::new("/x/y"),
            &io::Error::from_raw_os_error(libc::EACCES),
        );
        assert_eq!(e.to_string(), "/x/y: Permission denied (os error 13)");
        assert_eq!(e.raw_os_error(), Some(libc::EACCES));
        assert_eq!(FileError::new("/a", "odd").raw_os_error(), None);
    }
}
