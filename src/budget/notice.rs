//! Notices: when a default narrowed the result, the response says which default fired and
//! how to undo it, in the text the model reads.

use crate::policy::{FieldPath, Horizon};

use super::project::Selection;

/// The default live-only horizon dropped items.
pub fn horizon(horizon: &Horizon, noun: &str) -> String {
    format!(
        "This query used the default live-only horizon because \"horizon\" was not provided \
         ({} {noun} are excluded). If results seem incomplete, pass horizon:\"all\" to include them.",
        horizon.terminal.join("/"),
    )
}

/// The default summary detail left fields out.
pub fn detail(summary: &[FieldPath], noun: &str) -> String {
    format!(
        "This query used the default summary detail because \"detail\" was not provided \
         (each of the {noun} carries only {}). Pass detail:\"full\" for every field.",
        Selection::describe(summary)
    )
}

/// The default limit cut the list.
pub fn limit(shown: usize, matching: usize, limit: usize, max: usize, noun: &str) -> String {
    format!(
        "This query used the default limit of {limit} because \"limit\" was not provided: \
         {shown} of {matching} matching {noun} are shown. Pass the next_after value as after \
         for the next page, or a larger limit (at most {max})."
    )
}

/// The default limit was lowered so that the page fits the client's budget.
pub fn limit_fitted(
    shown: usize,
    matching: usize,
    default: usize,
    budget: &str,
    noun: &str,
) -> String {
    format!(
        "This query used the default limit, lowered from {default} to {shown} so that the page \
         fits the {budget}, because \"limit\" was not provided: {shown} of {matching} matching \
         {noun} are shown. Pass the next_after value as after for the next page; a larger limit \
         would be refused as too large."
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn horizon_wording_matches_the_contract() {
        let horizon = Horizon {
            field: vec!["state".into()],
            terminal: vec!["merged".into(), "closed-without-merge".into()],
        };
        assert_eq!(
            super::horizon(&horizon, "streams"),
            "This query used the default live-only horizon because \"horizon\" was not provided \
             (merged/closed-without-merge streams are excluded). If results seem incomplete, \
             pass horizon:\"all\" to include them."
        );
    }
}
