//! `tools/list`: the answer budgeted, and what it says of each tool remembered.

use super::*;

impl Interceptor {
    /// A response to the client's `tools/list`: the rewritten message, or `None` to forward it.
    /// `modern`: the request's `_meta` (2026-07-28): the list is fitted to the client it names,
    /// and marked `cacheScope: "private"` whenever its bytes depend on who asked: a rule's
    /// descriptor names the page sizes of the asking client's profile (an unknown client's
    /// list differs from codex's too), unless `--client` gives every client the same.
    pub fn tools_list_response(&self, message: &[u8], modern: Option<&Modern>) -> Option<Vec<u8>> {
        if let Some(name) = server_info_in_meta(message) {
            self.server_named(&name);
        }
        let budget = self.budget_for(modern);
        let text = self.list_result(message, &budget)?;
        let profiled = modern.is_some() && {
            let base = self.base.get();
            let choice = base.choice();
            choice.fit_clients && choice.forced.is_none() && !budget.policy().rules.is_empty()
        };
        let (raw, text) = text;
        let text = match profiled {
            true => crate::era::private(&text).unwrap_or(text),
            false => text,
        };
        Some(splice(message, raw, text.as_bytes()))
    }

    /// The rewritten result of a `tools/list` response (and where the server's is in
    /// `message`), or `None` when the budget leaves it as it is.
    fn list_result<'m>(&self, message: &'m [u8], budget: &Budget) -> Option<(&'m str, String)> {
        let policy = budget.policy();
        if policy.rules.is_empty() && !policy.auto && !policy.hides_any() {
            return None;
        }
        let raw = serde_json::from_slice::<ResultOnly<'_>>(message)
            .ok()?
            .result?;
        // Hidden tools first: the client never learns of them.
        let mut text: Option<String> = None;
        if policy.hides_any() {
            text = descriptor::without_hidden(raw.get(), |name| policy.hides(name));
        }
        let mut result: Value = serde_json::from_str(text.as_deref().unwrap_or(raw.get())).ok()?;
        self.remember_tools(&result);
        if policy.auto
            && let Some(spliced) =
                descriptor::add_auto_after(text.as_deref().unwrap_or(raw.get()), |name| {
                    budget.auto_for(name)
                })
        {
            text = Some(spliced);
        }
        if !policy.rules.is_empty() {
            if let Some(spliced) = &text {
                result = serde_json::from_str(spliced).ok()?;
            }
            if budget.rewrite_tools_list(&mut result) {
                // Written with the server's own bytes wherever the descriptors are unchanged.
                let original = text.as_deref().unwrap_or(raw.get());
                text = Some(crate::budget::exact::respell(&result, original));
            }
        }
        // Offered where a listed tool's results may be paged.
        let pageable = result
            .get("tools")
            .and_then(Value::as_array)
            .is_some_and(|tools| {
                tools.iter().any(|tool| {
                    tool.get("name")
                        .and_then(Value::as_str)
                        .is_some_and(|name| budget.auto_for(name) || budget.is_paged(name))
                })
            });
        // Listed once: after the server's last page of tools.
        let last_page = crate::budget::raw::members(raw.get()).is_some_and(|members| {
            members
                .iter()
                .rev()
                .find(|(k, _)| k == "nextCursor")
                .is_none_or(|(_, r)| raw.get()[r.clone()].trim() == "null")
        });
        if pageable
            && last_page
            && self.offers_search(budget)
            && let Some(spliced) = with_search_tool(text.as_deref().unwrap_or(raw.get()))
        {
            text = Some(spliced);
        }
        Some((raw.get(), text?))
    }

    fn remember_tools(&self, result: &Value) {
        let Some(tools) = result.get("tools").and_then(Value::as_array) else {
            return;
        };
        let mut known = self.tools.lock().unwrap_or_else(PoisonError::into_inner);
        for tool in tools {
            let Some(name) = tool.get("name").and_then(Value::as_str) else {
                continue;
            };
            let properties = tool
                .pointer("/inputSchema/properties")
                .and_then(Value::as_object);
            let names: Vec<String> = properties
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default();
            let narrowing = names
                .iter()
                .filter(|n| {
                    let lower = n.to_ascii_lowercase();
                    NARROWING
                        .iter()
                        .any(|w| lower == *w || (w.len() > 2 && lower.contains(w)))
                })
                .cloned()
                .collect();
            let closed = tool.get("inputSchema").and_then(descriptor::not_extensible);
            let was_closed = known.get(name).is_some_and(|info| info.closed);
            if let Some(why) = &closed
                && !was_closed
            {
                tracing::warn!(tool = %name, why = %why, "this tool's input schema cannot take the budget's arguments safely: it is left as the server wrote it and its results are not paged (the byte cap still holds)");
            }
            known.insert(
                name.to_string(),
                ToolInfo {
                    closed: closed.is_some(),
                    read_only: tool.pointer("/annotations/readOnlyHint")
                        == Some(&Value::Bool(true)),
                    own_after: names.iter().any(|n| n == "after"),
                    narrowing,
                    headers: properties
                        .map(|p| {
                            p.iter()
                                .filter_map(|(argument, schema)| {
                                    let header = schema.get("x-mcp-header")?.as_str()?;
                                    Some((header.to_string(), argument.clone()))
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                    declared: names.clone(),
                    strings: properties
                        .map(|p| {
                            let strings = p.iter().filter(|(_, schema)| takes_string(schema));
                            strings.map(|(argument, _)| argument.clone()).collect()
                        })
                        .unwrap_or_default(),
                },
            );
        }
    }
}

/// Whether an argument's schema takes a string: its type is one, or a union that holds one.
fn takes_string(schema: &Value) -> bool {
    let string = json!("string");
    match schema.get("type") {
        Some(Value::Array(types)) => types.contains(&string),
        Some(kind) => *kind == string,
        None => ["anyOf", "oneOf"].iter().any(|k| {
            schema[*k]
                .as_array()
                .is_some_and(|a| a.iter().any(|s| s.get("type") == Some(&string)))
        }),
    }
}
