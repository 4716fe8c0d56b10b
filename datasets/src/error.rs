//! The one error type for bad input data: it always says which file, and where known which row
//! and which column, so that a user can find the offending value before a long job starts.

use std::fmt;
use std::path::{Path, PathBuf};

/// A problem with a data file, located by file, row (0-based, as in the file) and column.
#[derive(Debug, Clone, PartialEq)]
pub struct DataError {
    pub file: PathBuf,
    pub row: Option<usize>,
    pub column: Option<String>,
    pub message: String,
}

impl DataError {
    /// An error about the whole file (unreadable, not parquet, ...).
    pub fn file(file: &Path, message: impl Into<String>) -> Self {
        Self {
            file: file.to_path_buf(),
            row: None,
            column: None,
            message: message.into(),
        }
    }

    /// An error about a column as a whole (missing, wrong type).
    pub fn column(file: &Path, column: &str, message: impl Into<String>) -> Self {
        Self {
            file: file.to_path_buf(),
            row: None,
            column: Some(column.to_string()),
            message: message.into(),
        }
    }

    /// An error about one value.
    pub fn cell(file: &Path, row: usize, column: &str, message: impl Into<String>) -> Self {
        Self {
            file: file.to_path_buf(),
            row: Some(row),
            column: Some(column.to_string()),
            message: message.into(),
        }
    }

    /// An error about one row as a whole.
    pub fn row(file: &Path, row: usize, message: impl Into<String>) -> Self {
        Self {
            file: file.to_path_buf(),
            row: Some(row),
            column: None,
            message: message.into(),
        }
    }
}

impl fmt::Display for DataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        match (&self.row, &self.column) {
            (Some(r), Some(c)) => write!(f, ": row {r}, column `{c}`")?,
            (Some(r), None) => write!(f, ": row {r}")?,
            (None, Some(c)) => write!(f, ": column `{c}`")?,
            (None, None) => {}
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for DataError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_file_row_and_column() {
        let e = DataError::cell(Path::new("a/train.parquet"), 3, "images", "bad bytes");
        assert_eq!(
            e.to_string(),
            "a/train.parquet: row 3, column `images`: bad bytes"
        );
        let e = DataError::column(Path::new("t.parquet"), "prompt", "missing");
        assert_eq!(e.to_string(), "t.parquet: column `prompt`: missing");
    }
}
