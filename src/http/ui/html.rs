//! The console's HTML: escaping and the page frame. Every value that comes
//! from the database, a request or an error goes through [`esc`] (or
//! [`Html::text`]) before it reaches a page, so a payload or an error text
//! holding markup is shown as text, never run.

/// `s` with `& < > " '` escaped for HTML text and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A page being written: markup pushed as is, text escaped.
#[derive(Default)]
pub struct Html(String);

impl Html {
    /// Markup written by this crate (never data).
    pub fn raw(&mut self, markup: &str) -> &mut Html {
        self.0.push_str(markup);
        self
    }

    /// Data, escaped.
    pub fn text(&mut self, text: &str) -> &mut Html {
        self.0.push_str(&esc(text));
        self
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

/// `write!(html, "<td>{}</td>", esc(x))`: markup with escaped arguments.
impl std::fmt::Write for Html {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.push_str(s);
        Ok(())
    }
}

/// The page frame: title, navigation (when signed in) and `body`.
pub fn page(title: &str, signed_in: Option<&str>, body: &str) -> String {
    let nav = match signed_in {
        Some(csrf) => format!(
            "<nav><a href=\"/ui\">Routes</a> <a href=\"/ui/queues\">Queues</a> \
             <a href=\"/ui/jobs\">Jobs</a> <a href=\"/ui/dead\">Dead letters</a>\
             <form method=\"post\" action=\"/ui/logout\" class=\"logout\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
             <button>Log out</button> <button name=\"everywhere\" value=\"1\" id=\"logout-everywhere\">\
             Sign out everywhere</button></form></nav>",
            esc(csrf)
        ),
        None => String::new(),
    };
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · qbridge</title><style>{STYLE}</style>\
         <script src=\"/ui/static/console.js\" defer></script></head>\
         <body><header><strong>qbridge</strong> console</header>{nav}<main>{body}</main></body></html>",
        esc(title)
    )
}

/// A small stylesheet, inline: readable on a phone and on a wall screen.
const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:0;color:#1b1f24}\
header{background:#1b1f24;color:#fff;padding:.6em 1em}\
nav{padding:.5em 1em;border-bottom:1px solid #ddd;display:flex;gap:1em;flex-wrap:wrap;align-items:center}\
nav .logout{margin-left:auto}main{padding:1em;max-width:70em}\
table{border-collapse:collapse;width:100%;margin:.5em 0 1.5em}\
th,td{text-align:left;padding:.3em .5em;border-bottom:1px solid #eee;vertical-align:top}\
.pass{color:#116329}.fail{color:#a40e26;font-weight:600}.muted{color:#666}\
.flash{padding:.5em 1em;background:#fff8c5;border:1px solid #d4a72c}\
.error{padding:.5em 1em;background:#ffebe9;border:1px solid #cf222e}\
pre{white-space:pre-wrap;word-break:break-all;background:#f6f8fa;padding:.5em}\
form.inline{display:inline-block;margin:.2em 1em .2em 0}input,button{font-size:1em;padding:.2em .4em}\
@media (max-width:40em){td,th{display:block;border:0}tr{border-bottom:1px solid #ddd;display:block}}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_data_is_escaped() {
        assert_eq!(
            esc("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
        let mut h = Html::default();
        h.raw("<p>").text("<b>").raw("</p>");
        assert_eq!(h.into_string(), "<p>&lt;b&gt;</p>");
    }
}
