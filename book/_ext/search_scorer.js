/* The book's search scorer (Sphinx's html_search_scorer; book/_ext/html_fixes.py
 * sets it for both languages).
 *
 * Sphinx 7.4 scores a page by where a query word occurs (any section title
 * 15, body text 5) and breaks ties by title, as text: a search for
 * "KV cache" listed chapters 10, 12 and 13 (each has a section about the
 * cache) before "9. The KV cache", because "10." sorts before "9.". Here a
 * page whose own title holds every word of the query gets PAGE_TITLE more,
 * so the chapter about a topic comes before the chapters that mention it.
 * The numbers below are Sphinx's defaults (searchtools.js). */
var Scorer = (() => {
  const PAGE_TITLE = 20;
  // The query's words, read once: the search page runs the query in its URL.
  const words = (new URLSearchParams(window.location.search).get("q") || "")
    .toLowerCase().split(/\s+/).filter((w) => w);
  return {
    score: (result) => {
      const [, title, , , score] = result;
      // "<span ...>9. </span>The KV cache" or "... > a section's title"
      const page = title.split(" > ")[0].replace(/<[^>]*>/g, "").toLowerCase();
      const named = words.length > 0 && words.every((w) => page.includes(w));
      return named ? score + PAGE_TITLE : score;
    },

    // query matches the full name of an object
    objNameMatch: 11,
    // or matches in the last dotted part of the object name
    objPartialMatch: 6,
    // Additive scores depending on the priority of the object
    objPrio: {
      0: 15, // used to be importantResults
      1: 5, // used to be objectResults
      2: -5, // used to be unimportantResults
    },
    //  Used when the priority is not in the mapping.
    objPrioDefault: 0,

    // query found in title
    title: 15,
    partialTitle: 7,
    // query found in terms
    term: 5,
    partialTerm: 2,
  };
})();
