//! Finishing a call's result under its plan: a rule's page (text or items), the pipeline's
//! page, the default limit fitted to the budget, and what is refused unpaged.

use serde_json::{Value, json};

use super::args::{CallArgs, Detail, HorizonArg};
use super::render::RenderError;
use crate::policy::Rule;
use crate::tokens;

use super::*;

impl Budget {
    /// A rule page cut from `entry` (the upstream result of the chain, fresh or from the
    /// cache), and whether more pages remain (the entry is worth keeping).
    pub fn finish_rule(
        &self,
        plan: &CallPlan,
        entry: &chain::RuleResult,
    ) -> Result<(Finished, bool), RenderError> {
        if let Some((rule, Some(Paging::Text(args)))) = self.rule_of(plan)
            && let Some(text) = &rule.text
            && entry.has_layout()
        {
            // A JSON document is paged as JSON, by the automatic pager: every page parses.
            if args.auto.is_some() || entry.text_is_json() {
                let at = args.auto;
                let digest = args.digest;
                return Ok((Finished::Auto { at, digest }, false));
            }
            return self.text_from_layout(plan, text.page_bytes, args, entry);
        }
        let named = plan.naming(entry.reference());
        let plan = named.as_ref().unwrap_or(plan);
        let finished = self.finish_walked(plan, entry.raw(), entry.walked())?;
        let more = match &finished {
            // (`next_after` may be inside a text block's JSON, its quotes escaped.)
            // A text page the pipeline wrote gives its cursor only in its notice.
            Finished::Bytes(bytes) => {
                memchr::memmem::find(bytes, b"next_after").is_some()
                    || memchr::memmem::find(bytes, b"after:\\\"").is_some()
            }
            Finished::Auto { .. } => true,
        };
        Ok((finished, more))
    }

    /// A text page from the entry's line index, made smaller until what the client reads of it
    /// fits the byte, token and line budgets (a page counts every copy of its text the client
    /// reads), then held to the cap.
    pub(super) fn text_from_layout(
        &self,
        plan: &CallPlan,
        mut page_bytes: usize,
        args: &args::TextArgs,
        entry: &chain::RuleResult,
    ) -> Result<(Finished, bool), RenderError> {
        let tool = plan.tool.as_str();
        let mut outcome = None;
        for _ in 0..12 {
            let made = entry.text_page(tool, page_bytes, args, &self.key, self.search_hint());
            if let Some(chain::TextOutcome::Fits) = made
                && let (Some(text), Some((_, _, share))) =
                    (entry.text(), self.over_by(tool, entry.raw().as_bytes()))
            {
                // The text is under the page size, but what the client reads of the result
                // (the text twice, say) is not: it comes in smaller pages.
                let smaller = ((text.len() as f64) * share * 0.9) as usize;
                if smaller < 64 || smaller >= page_bytes {
                    outcome = made;
                    break;
                }
                page_bytes = smaller;
                continue;
            }
            let Some(chain::TextOutcome::Page { result, more }) = made else {
                outcome = made;
                break;
            };
            if let Some((_, _, share)) = self.over_by(tool, result.as_bytes()) {
                let smaller = ((page_bytes.min(result.len()) as f64) * share * 0.9) as usize;
                outcome = Some(chain::TextOutcome::Page { result, more });
                if smaller < 64 {
                    break; // the cap's check refuses it
                }
                page_bytes = smaller;
                continue;
            }
            outcome = Some(chain::TextOutcome::Page { result, more });
            break;
        }
        match outcome {
            Some(chain::TextOutcome::Page { result, more }) => {
                match self.over(tool, result.as_bytes()) {
                    None => Ok((Finished::Bytes(result.into_bytes()), more)),
                    Some((size, budget)) => {
                        let text = cap::refusal(tool, &size, &budget, &cap::Moves::default());
                        tracing::info!(tool, size, budget, "result refused by the cap");
                        Ok((
                            Finished::Bytes(serde_json::to_vec(&refusal_result(&text))?),
                            false,
                        ))
                    }
                }
            }
            Some(chain::TextOutcome::Changed) => {
                let text = format!(
                    "The result of {tool} changed since the page this cursor continues was served (the proxy no longer held it, so {tool} ran again and answered otherwise). Call {tool} again without after to start over."
                );
                Ok((
                    Finished::Bytes(serde_json::to_vec(&refusal_result(&text))?),
                    false,
                ))
            }
            // It fits (or there is no page to make): the result as it is, held to the cap.
            Some(chain::TextOutcome::Fits) | None => {
                let bytes = match self.check_unpaged(plan, entry.raw())? {
                    Some(refusal) => refusal,
                    None => entry.raw().as_bytes().to_vec(),
                };
                Ok((Finished::Bytes(bytes), false))
            }
        }
    }

    /// [`Budget::finish_call`] on the server's text of the result: whatever the page keeps
    /// unchanged is written with the server's own bytes ([`exact`]).
    pub fn finish_call_raw(&self, plan: &CallPlan, raw: &str) -> Result<Finished, RenderError> {
        if self.pages_text(plan) {
            let entry = chain::RuleResult::new(bytestring::ByteString::from(raw), true);
            if entry.has_layout() {
                return self.finish_rule(plan, &entry).map(|(finished, _)| finished);
            }
        }
        self.finish_walked(plan, raw, None)
    }

    /// The walk of `raw` for an items rule's list ([`reduce::walk`]), where the pipeline would
    /// narrow the list where it lies: kept with a cached result, so its later pages skip it.
    pub fn walk(&self, plan: &CallPlan, raw: &str) -> Option<reduce::Scanned> {
        let (rule, _) = self.reducible(plan)?;
        reduce::walk(rule.items.as_ref()?, raw)
    }

    /// [`Budget::finish_call_raw`] for an items rule, with the walk of `raw` when it was made.
    pub fn finish_walked(
        &self,
        plan: &CallPlan,
        raw: &str,
        walked: Option<&reduce::Scanned>,
    ) -> Result<Finished, RenderError> {
        let reduced = match (walked, self.reducible(plan)) {
            (Some(walked), Some((rule, args))) => rule
                .items
                .as_ref()
                .and_then(|items| reduce::reduce_scanned(items, args, raw, walked)),
            _ => self.reduced(plan, raw),
        };
        if let Some(reduced) = reduced {
            let result: Value = serde_json::from_str(&reduced.text)?;
            return self.finish(plan, result, Some(&reduced.text), Some(&reduced.narrowed));
        }
        let result: Value = serde_json::from_str(raw)?;
        self.finish(plan, result, Some(raw), None)
    }

    /// The result cut down to its page ([`reduce`]), where the pipeline would page its items
    /// and nothing needs the whole list afterwards.
    pub(super) fn reduced(&self, plan: &CallPlan, raw: &str) -> Option<reduce::Reduced> {
        let (rule, args) = self.reducible(plan)?;
        reduce::reduce(rule.items.as_ref()?, args, raw)
    }

    /// The rule and arguments of a call whose list [`reduce`] may narrow where it lies.
    pub(super) fn reducible<'a>(&'a self, plan: &'a CallPlan) -> Option<(&'a Rule, &'a CallArgs)> {
        if !self.reduce {
            return None;
        }
        let Some((rule, Some(Paging::Items(args)))) = self.rule_of(plan) else {
            return None;
        };
        // An automatic page's cursor is for the automatic pager.
        if args
            .after
            .as_ref()
            .and_then(auto::At::from_position)
            .is_some()
        {
            return None;
        }
        rule.items.as_ref()?;
        Some((rule, args))
    }

    pub(super) fn finish(
        &self,
        plan: &CallPlan,
        mut result: Value,
        raw: Option<&str>,
        narrowed: Option<&pipeline::Narrowed>,
    ) -> Result<Finished, RenderError> {
        let rule = self.rule_of(plan);
        let is_error = result.get("isError").and_then(Value::as_bool) == Some(true);
        match rule {
            Some((rule, Some(Paging::Items(args)))) if !is_error => {
                if let Some(items) = &rule.items {
                    if let Some(at) = args.after.as_ref().and_then(auto::At::from_position) {
                        return Ok(Finished::Auto {
                            at: Some(at),
                            digest: args.digest,
                        });
                    }
                    // A default page over the client's budget is made again with fewer items
                    // (under the policy's own cap, its default limit is the author's choice).
                    let fits_client = self.limits.profile.is_some();
                    let original = (fits_client && args.limit_defaulted && args.limit > 1)
                        .then(|| result.clone());
                    let located = match narrowed {
                        Some(narrowed) => pipeline::run_reduced(
                            &plan.tool,
                            items,
                            args,
                            narrowed,
                            &self.key,
                            &mut result,
                        )?,
                        None => pipeline::run(&plan.tool, items, args, &self.key, &mut result)?,
                    };
                    if !located && rule.auto {
                        self.warn_unmatched(&plan.tool, &items.path_text);
                        return Ok(Finished::Auto {
                            at: None,
                            digest: args.digest,
                        });
                    }
                    if let Some(original) = original
                        && located
                    {
                        self.fit_default_limit(
                            &plan.tool,
                            (items, args, narrowed),
                            original,
                            raw,
                            &mut result,
                        )?;
                    }
                }
            }
            Some((rule, Some(Paging::Text(args)))) if !is_error => {
                if let Some(at) = args.auto {
                    let digest = args.digest;
                    return Ok(Finished::Auto {
                        at: Some(at),
                        digest,
                    });
                }
                if let Some(text) = &rule.text {
                    self.run_text_fitted(&plan.tool, text.page_bytes, args, &mut result);
                }
            }
            _ => {}
        }
        let bytes = match raw {
            Some(raw) => exact::respell_result(&result, raw).into_bytes(),
            None => serde_json::to_vec(&result)?,
        };
        let Some((size, budget)) = self.over(&plan.tool, &bytes) else {
            return Ok(Finished::Bytes(bytes));
        };
        let mut moves = self.moves(rule);
        moves.single_item =
            moves.limit == Some(1) || self.page_items(&plan.tool, &result) == Some(1);
        let text = cap::refusal(&plan.tool, &size, &budget, &moves);
        tracing::info!(tool = %plan.tool, size, budget, "result refused by the cap");
        Ok(Finished::Bytes(serde_json::to_vec(&refusal_result(&text))?))
    }

    /// Whether a serialized result is over this session's budget for `tool`: what it measures
    /// and the budget it is over, for the refusal. Bytes are what the client's model reads of
    /// it ([`cap::read_bytes`]).
    pub fn over(&self, tool: &str, result: &[u8]) -> Option<(String, String)> {
        self.over_by(tool, result)
            .map(|(size, budget, _)| (size, budget))
    }

    /// [`Budget::over`], with the share of the result that would fit.
    pub(super) fn over_by(&self, tool: &str, result: &[u8]) -> Option<(String, String, f64)> {
        self.over_cap(self.cap_for(tool), result)
    }

    /// [`Budget::over_by`], for a result held to `cap` bytes.
    pub(super) fn over_cap(&self, cap: usize, result: &[u8]) -> Option<(String, String, f64)> {
        let read = match std::str::from_utf8(result) {
            Ok(text) => cap::read_bytes(self.limits.reads, text),
            Err(_) => result.len(),
        };
        if cap::exceeds(read, cap) {
            return Some((
                format!("{read} bytes"),
                self.limits.byte_budget(cap).as_cap(),
                cap as f64 / read.max(1) as f64,
            ));
        }
        if self.limits.tokens.is_none() && self.limits.lines.is_none() {
            return None;
        }
        let over = tokens::over(std::str::from_utf8(result).ok()?, &self.limits)?;
        Some((over.size(), over.budget(&self.limits), over.ratio()))
    }

    /// A page of the default size over the budget: made again, from `original`, with as many
    /// items as fit (at least one), and a notice that says the default was lowered.
    pub(super) fn fit_default_limit(
        &self,
        tool: &str,
        (items, args, narrowed): (
            &crate::policy::Items,
            &CallArgs,
            Option<&pipeline::Narrowed>,
        ),
        original: Value,
        raw: Option<&str>,
        result: &mut Value,
    ) -> Result<(), RenderError> {
        let mut limit = args.limit;
        for _ in 0..8 {
            let bytes = match raw {
                Some(raw) => exact::respell_result(result, raw).into_bytes(),
                None => serde_json::to_vec(&*result)?,
            };
            let Some((_, budget, share)) = self.over_by(tool, &bytes) else {
                return Ok(());
            };
            let smaller = ((limit as f64) * share * 0.9) as usize;
            let smaller = smaller.clamp(1, limit.saturating_sub(1).max(1));
            if smaller >= limit {
                return Ok(()); // one item over the budget: the cap refuses it
            }
            limit = smaller;
            let fitted = CallArgs {
                limit,
                ..args.clone()
            };
            *result = original.clone();
            pipeline::run_fitted(
                tool,
                items,
                &fitted,
                Some(&budget),
                narrowed,
                &self.key,
                result,
            )?;
        }
        Ok(())
    }

    /// The result of a call that is not paged, unread when it can be: `None` when it fits (it
    /// passes unchanged), else the refusal.
    pub fn check_unpaged(
        &self,
        plan: &CallPlan,
        raw: &str,
    ) -> Result<Option<Vec<u8>>, RenderError> {
        let Some((size, budget)) = self.over(&plan.tool, raw.as_bytes()) else {
            return Ok(None);
        };
        let rule = self.rule_of(plan);
        let moves = self.moves(rule);
        if moves.no_rule {
            tracing::warn!(
                tool = %plan.tool,
                size,
                budget,
                "result refused: the tool has no budget rule and automatic paging is off; a [[tool]] rule (text paging for text, items for a list) or budget.auto = true would page it"
            );
        } else {
            tracing::info!(tool = %plan.tool, size, budget, "result refused by the cap");
        }
        let text = cap::refusal(&plan.tool, &size, &budget, &moves);
        Ok(Some(serde_json::to_vec(&refusal_result(&text))?))
    }

    /// [`Budget::run_text`], with pages made smaller until what the client reads of one fits
    /// the byte, token and line budgets.
    pub(super) fn run_text_fitted(
        &self,
        tool: &str,
        mut page_bytes: usize,
        args: &args::TextArgs,
        result: &mut Value,
    ) {
        let original = result.clone();
        self.run_text(tool, page_bytes, args, result);
        for _ in 0..12 {
            let Ok(page) = serde_json::to_string(result) else {
                return;
            };
            let Some((_, _, share)) = self.over_by(tool, page.as_bytes()) else {
                return;
            };
            page_bytes = ((page_bytes.min(page.len()) as f64) * share * 0.9) as usize;
            if page_bytes < 64 {
                return; // the cap's check refuses it
            }
            *result = original.clone();
            self.run_text(tool, page_bytes, args, result);
        }
    }

    pub(super) fn moves(&self, rule: Option<(&Rule, Option<&Paging>)>) -> cap::Moves {
        match rule {
            None => cap::Moves {
                no_rule: true,
                ..cap::Moves::default()
            },
            Some((_, Some(Paging::Text(_)))) => cap::Moves::default(),
            Some((Rule { items: None, .. }, _)) | Some((_, None)) => cap::Moves {
                not_paged: true,
                ..cap::Moves::default()
            },
            Some((
                Rule {
                    items: Some(items), ..
                },
                Some(Paging::Items(args)),
            )) => cap::Moves {
                filters: items.filters.iter().map(|(name, _)| name.clone()).collect(),
                limit: Some(args.limit),
                detail_full: args.detail == Some(Detail::Full),
                horizon_all: (args.horizon == Some(HorizonArg::All)).then(|| {
                    let terminal = items
                        .horizon
                        .as_ref()
                        .map(|h| h.terminal.clone())
                        .unwrap_or_default();
                    (terminal, items.noun.clone())
                }),
                ..cap::Moves::default()
            },
        }
    }

    /// Pages the first text block of a result by lines; the page replaces it (and the same
    /// text in `structuredContent`), and a notice block follows it.
    pub(super) fn run_text(
        &self,
        tool: &str,
        page_bytes: usize,
        args: &args::TextArgs,
        result: &mut Value,
    ) {
        let Some((index, whole)) = place::text_blocks(result)
            .next()
            .map(|(i, t)| (i, t.to_string()))
        else {
            return;
        };
        let start = args.after.unwrap_or(0);
        if start == 0 && whole.len() <= page_bytes {
            return; // fits: untouched
        }
        let page = text::page(&whole, start, page_bytes);
        let next = (page.end < whole.len()).then(|| {
            self.key.mint(
                &page::Position {
                    offset: page.end,
                    key: None,
                },
                &args.digest,
            )
        });
        let notice = text::notice(&page, whole.len(), tool, next.as_deref(), page_bytes);
        let slice = whole[page.start..page.end].to_string();
        if let Some(Value::Object(structured)) = result.get_mut("structuredContent") {
            for value in structured.values_mut() {
                if value.as_str() == Some(whole.as_str()) {
                    *value = json!(slice);
                }
            }
        }
        if let Some(content) = place::content_mut(result) {
            content[index]["text"] = json!(slice);
            content.insert(index + 1, json!({"type": "text", "text": notice}));
        }
    }
}
