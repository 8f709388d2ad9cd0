"""What the browser tests measure on every page they visit, in the browser (``page.evaluate``):
words of table cells split across lines, and content clipped or sticking out.

A *word* is a run of characters between whitespace (text in inline elements, such as a link
inside a cell, continues the word; a line break, a block or a cell ends it). A word split across
lines is a fault (``succeed|ed``, ``127.0.0.1:487|84``, ``m.room.me|ssage``) unless it breaks
right after one of an identifier's own separators, ``: . / _ -`` (``!room:|server``,
``m.room.|message``, ``check_|topological_ordering``), or at a ``<wbr>`` the page put there.

*Clipped*: a shown element whose content is wider than its box (``scrollWidth > clientWidth``)
must be a box the user can scroll (``overflow-x: auto`` or ``scroll``): with ``hidden`` or
``clip`` the content is cut off at the right; with ``visible`` a cell's or a ``<pre>``'s
content runs over what is beside it, and anything's may run past the window. And nothing
makes the page wider than the window.
"""
from __future__ import annotations

#: Characters after which an identifier may wrap (its own separators).
SEPARATORS = ":./_-"

_MEASURE = r"""([separators, openDetails]) => {
  if (openDetails) document.querySelectorAll("details").forEach(d => { d.open = true; });
  const out = [];
  const name = (e) => e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") +
    (typeof e.className === "string" && e.className ? "." + e.className.trim().split(/\s+/).join(".") : "");
  const path = (e) => {
    const parts = [];
    for (let n = e; n && n !== document.body && parts.length < 4; n = n.parentElement) parts.unshift(name(n));
    return parts.join(" > ");
  };
  const shown = (e) => e.getClientRects().length > 0 && getComputedStyle(e).visibility !== "hidden";

  // -- words split across lines, in every table cell --------------------------------------
  const INLINE = new Set(["inline", "inline-block", "contents"]);
  for (const cell of document.querySelectorAll("td, th")) {
    if (!shown(cell)) continue;
    // the cell's characters in order; " " where a block, a line break or a nested cell ends
    // a word, "\u200b" for a <wbr> (a break the page allows)
    const chars = [];
    const walk = (node) => {
      for (const child of node.childNodes) {
        if (child.nodeType === Node.TEXT_NODE) {
          for (let i = 0; i < child.data.length; i++) chars.push({node: child, i, ch: child.data[i]});
        } else if (child.nodeType === Node.ELEMENT_NODE) {
          const tag = child.tagName;
          if (tag === "WBR") { chars.push({ch: "\u200b"}); continue; }
          if (tag === "BR" || tag === "TD" || tag === "TH" || tag === "TABLE") { chars.push({ch: " "}); continue; }
          const display = getComputedStyle(child).display;
          if (display === "none") continue;
          const block = !INLINE.has(display);
          if (block) chars.push({ch: " "});
          walk(child);
          if (block) chars.push({ch: " "});
        }
      }
    };
    walk(cell);
    const box = (c) => {
      const r = document.createRange();
      r.setStart(c.node, c.i); r.setEnd(c.node, c.i + 1);
      const rect = r.getBoundingClientRect();
      return rect.width || rect.height ? rect : null;
    };
    let start = 0;
    while (start < chars.length) {
      if (/\s/.test(chars[start].ch)) { start++; continue; }
      let end = start;
      while (end < chars.length && !/\s/.test(chars[end].ch)) end++;
      const word = chars.slice(start, end);
      const text = word.map(c => c.ch).join("");
      let prev = null, prevAt = -1;
      const breaks = [];
      word.forEach((c, at) => {
        if (!c.node) return;
        const rect = box(c);
        if (!rect) return;
        // on a later line: below the middle of the character before, and not to its right
        if (prev && rect.top > (prev.top + prev.bottom) / 2 && rect.left < prev.right) {
          const between = word.slice(prevAt, at).map(x => x.ch).join("");
          const allowed = between.includes("\u200b") || separators.includes(word[prevAt].ch);
          if (!allowed) breaks.push(at);
        }
        prev = rect; prevAt = at;
      });
      if (breaks.length) {
        let marked = "";
        word.forEach((c, at) => { if (breaks.includes(at)) marked += "|"; if (c.ch !== "\u200b") marked += c.ch; });
        out.push("word split: " + JSON.stringify(marked) + " in " + path(cell));
      }
      start = end;
    }
  }

  // -- clipped, or sticking out -----------------------------------------------------------
  for (const e of document.querySelectorAll("body *")) {
    // (a box 1 pixel wide holds text for screen readers only: Django's .visually-hidden)
    if (e.clientWidth <= 1 || e.scrollWidth <= e.clientWidth + 1 || !shown(e)) continue;
    const overflow = getComputedStyle(e).overflowX;
    if (overflow === "auto" || overflow === "scroll") continue;
    if (overflow !== "visible") {
      out.push("clipped: " + path(e) + " " + e.scrollWidth + " > " + e.clientWidth);
      continue;
    }
    // Visible overflow runs over what is beside it: a cell over the next one, a <pre> over
    // the page's edge. (Elsewhere it is layout, like the admin's sidebar in its margin, and
    // what it makes too wide is caught as a clipping box around it or as the page.)
    const right = e.getBoundingClientRect().left + e.scrollWidth;
    if (["TD", "TH", "PRE"].includes(e.tagName) || right > window.innerWidth + 1) {
      out.push("sticks out: " + path(e) + " " + e.scrollWidth + " > " + e.clientWidth);
    }
  }
  const page = document.documentElement;
  if (page.scrollWidth > page.clientWidth + 1) {
    out.push("page wider than the window: " + page.scrollWidth + " > " + page.clientWidth);
  }
  return out;
}"""


def layout_faults(page, *, open_details: bool = True) -> list[str]:
    """Words of table cells split across lines, and clipped or protruding content, on the page
    as shown now (folded ``<details>`` opened first, so what they hold is measured too)."""
    return page.evaluate(_MEASURE, [SEPARATORS, open_details])
