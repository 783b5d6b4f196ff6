//! Passwords kept out of what is shown: a store URL is printed in errors,
//! logs and `--check`, whichever store it names, so its masking lives
//! below every store.

/// `url` with any password replaced by `***`, for messages and logs: the
/// user-info password of a URL and `password=` options, in a URL's query
/// or in the `key=value` form.
pub fn redact_url(url: &str) -> String {
    let (head, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => return redact_options(url, ' '),
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{hosts}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => format!("{path}?{}", redact_options(query, '&')),
        None => tail.to_owned(),
    };
    format!("{head}{authority}{tail}")
}

/// `password=…` options in a `sep`-separated list, redacted.
fn redact_options(options: &str, sep: char) -> String {
    let parts: Vec<String> = options
        .split(sep)
        .map(|part| match part.split_once('=') {
            Some((name, _)) if name.trim().eq_ignore_ascii_case("password") => {
                format!("{name}=***")
            }
            _ => part.to_owned(),
        })
        .collect();
    parts.join(&sep.to_string())
}
