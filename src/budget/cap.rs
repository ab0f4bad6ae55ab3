//! Stage: the cap. After all narrowing, a result at or above `max_bytes` is refused with the
//! exact next moves — an error, never a silent cut.

use crate::client::Reads;

/// The moves that exist for one call, from which the refusal names the next step.
#[derive(Debug, Default)]
pub struct Moves {
    /// The tool has no budget rule at all.
    pub no_rule: bool,
    /// The tool has a rule, but its results are not paged.
    pub not_paged: bool,
    /// Filter argument names the tool offers.
    pub filters: Vec<String>,
    /// The call's page size, when the tool is paged.
    pub limit: Option<usize>,
    /// The call asked for detail:"full".
    pub detail_full: bool,
    /// The call asked for horizon:"all": (terminal values, noun).
    pub horizon_all: Option<(Vec<String>, String)>,
    /// The page holds a single item: a smaller page cannot help.
    pub single_item: bool,
}

/// The bytes of the serialized tool result `result` that a client's model reads (see
/// [`Reads`]): all of it, or one of `content` and `structuredContent`.
pub fn read_bytes(reads: Reads, result: &str) -> usize {
    if reads == Reads::Both {
        return result.len();
    }
    let Some(members) = super::raw::members(result) else {
        return result.len();
    };
    let structured = members
        .iter()
        .rev()
        .find(|(k, _)| k == "structuredContent")
        .map(|(_, r)| r.len());
    match (reads, structured) {
        (_, None) => result.len(),
        // Everything but structuredContent (its key and separator included).
        (Reads::Content, Some(structured)) => result
            .len()
            .saturating_sub(structured + "\"structuredContent\":,".len()),
        (_, Some(structured)) => structured,
    }
}

/// Whether a result of `bytes` bytes is over the cap.
pub fn exceeds(bytes: usize, max_bytes: usize) -> bool {
    bytes >= max_bytes
}

/// The refusal the model reads: `size` is what the result measures ("812345 bytes") and
/// `budget` the limit it is over ("200000-byte cap", "the 10240-byte budget for codex").
pub fn refusal(tool: &str, size: &str, budget: &str, moves: &Moves) -> String {
    let head = format!("result-too-large: {tool} response is {size}, exceeds the {budget} — ");
    if moves.no_rule {
        // The operator's move (a rule, automatic paging) is logged where the refusal is made;
        // the model gets one it can make.
        return format!("{head}call {tool} again with arguments that select less");
    }
    if moves.not_paged {
        return format!(
            "{head}{tool}'s results are capped but not paged by the policy; call it with narrower arguments"
        );
    }
    if moves.single_item {
        let mut steps = Vec::new();
        if moves.detail_full {
            steps.push(
                "omit detail:full (summary, the default, keeps only the main fields)".to_string(),
            );
        }
        if !moves.filters.is_empty() {
            steps.push(format!(
                "pick another item with the {} filter",
                moves.filters.join("/")
            ));
        }
        steps.push(
            "read this item with a tool that returns it in parts, if the server has one (an item is never split)"
                .to_string(),
        );
        return format!(
            "result-too-large: {tool}'s page holds a single item and is {size}, more than the {budget} — {}",
            join_or(&steps)
        );
    }
    let mut steps = Vec::new();
    if !moves.filters.is_empty() {
        let names = moves.filters.join("/");
        let article = if names.starts_with(['a', 'e', 'i', 'o', 'u']) {
            "an"
        } else {
            "a"
        };
        steps.push(format!("narrow with {article} {names} filter"));
    }
    if moves.limit.is_some_and(|l| l > 1) {
        steps.push("lower limit below its current value".to_string());
    }
    if moves.detail_full {
        steps.push("omit detail:full (summary, the default, is far smaller)".to_string());
    }
    if steps.is_empty()
        && let Some((terminal, noun)) = &moves.horizon_all
    {
        steps.push(format!(
            "omit horizon:\"all\" (live, the default, leaves out {} {noun})",
            terminal.join("/")
        ));
    }
    if steps.is_empty() {
        steps.push("call it with narrower arguments".to_string());
    }
    format!("{head}{}", join_or(&steps))
}

/// "a, b, or c".
fn join_or(steps: &[String]) -> String {
    match steps.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{}, or {last}", rest.join(", ")),
        _ => steps.join(""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fleet_refusal_matches_the_contract() {
        let moves = Moves {
            filters: vec!["state".into(), "streams".into()],
            limit: Some(100),
            detail_full: true,
            horizon_all: Some((vec!["merged".into()], "streams".into())),
            ..Moves::default()
        };
        assert_eq!(
            refusal("fleet_show", "812345 bytes", "200000-byte cap", &moves),
            "result-too-large: fleet_show response is 812345 bytes, exceeds the 200000-byte cap — \
             narrow with a state/streams filter, lower limit below its current value, or omit \
             detail:full (summary, the default, is far smaller)"
        );
    }

    #[test]
    fn a_single_item_over_the_budget_never_hears_lower_limit() {
        let moves = Moves {
            filters: vec!["state".into()],
            limit: Some(1),
            detail_full: true,
            single_item: true,
            ..Moves::default()
        };
        let text = refusal("fleet_show", "250000 bytes", "200000-byte cap", &moves);
        assert_eq!(
            text,
            "result-too-large: fleet_show's page holds a single item and is 250000 bytes, more than the 200000-byte cap — omit detail:full (summary, the default, keeps only the main fields), pick another item with the state filter, or read this item with a tool that returns it in parts, if the server has one (an item is never split)"
        );
        assert!(!text.contains("lower limit"));
    }

    #[test]
    fn only_moves_that_exist_are_named() {
        let only_horizon = Moves {
            limit: Some(1),
            horizon_all: Some((vec!["merged".into(), "closed".into()], "streams".into())),
            ..Moves::default()
        };
        assert_eq!(
            refusal("t", "5 bytes", "4-byte cap", &only_horizon),
            "result-too-large: t response is 5 bytes, exceeds the 4-byte cap — omit horizon:\"all\" (live, the default, leaves out merged/closed streams)"
        );
        let limit_only = Moves {
            limit: Some(25),
            ..Moves::default()
        };
        assert_eq!(
            refusal("t", "5 bytes", "4-byte cap", &limit_only),
            "result-too-large: t response is 5 bytes, exceeds the 4-byte cap — lower limit below its current value"
        );
        assert_eq!(
            refusal(
                "x",
                "300000 bytes",
                "200000-byte cap",
                &Moves {
                    no_rule: true,
                    ..Moves::default()
                }
            ),
            "result-too-large: x response is 300000 bytes, exceeds the 200000-byte cap — call x again with arguments that select less"
        );
        assert_eq!(
            refusal(
                "d",
                "9 bytes",
                "9-byte cap",
                &Moves {
                    not_paged: true,
                    ..Moves::default()
                }
            ),
            "result-too-large: d response is 9 bytes, exceeds the 9-byte cap — d's results are capped but not paged by the policy; call it with narrower arguments"
        );
        assert!(exceeds(200000, 200000));
        assert!(!exceeds(199999, 200000));
    }
}
