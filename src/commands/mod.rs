//! The commands that read a policy or a recording and print: `report`, `suggest`, `check` and
//! `explain`.

pub mod explain;
pub mod report;
pub mod suggest;
