// The trajectory viewer. Reads the JSON blocks of its own page; fetches nothing.
// Every piece of run data (token text, messages, tool calls, ids) reaches the page through
// textContent or an SVG text node, never through HTML parsing. ASCII only.
"use strict";
(function () {
  const CHUNK = 2000; // tokens rendered per step of a sample's lazy token view
  const RUN = readJson("run-data");
  const LEGEND = new Map(RUN.legend.map((r) => [r.code, r]));
  const details = new Map(); // episode index -> parsed detail
  const sampleIds = new Map(); // "episode/sample" -> Int32Array of the sample's token ids
  const views = new Map(); // "episode/sample" -> TokenView
  const filters = { status: "all", gate: null };
  const tip = h("div", null);
  tip.id = "tip";

  function readJson(id) {
    return JSON.parse(document.getElementById(id).textContent);
  }

  function h(tag, cls, text) {
    const el = document.createElement(tag);
    if (cls) el.className = cls;
    if (text !== undefined && text !== null) el.textContent = String(text);
    return el;
  }

  function s(tag, attrs, text) {
    const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
    if (text !== undefined) el.textContent = String(text);
    return el;
  }

  function fmt(n) {
    return n === null || n === undefined ? "\u2014" : Number(n).toLocaleString("en-US");
  }

  function signed(x, digits) {
    if (x === null || x === undefined) return "\u2014";
    return (x > 0 ? "+" : "") + x.toFixed(digits);
  }

  function reasonLabel(code) {
    const r = LEGEND.get(code);
    return r ? r.label : code;
  }

  function detail(index) {
    if (!details.has(index)) details.set(index, readJson("episode-" + index));
    return details.get(index);
  }

  function agentName(agent) {
    return agent === null || agent === undefined ? "main agent" : "sub-agent " + agent;
  }

  // ---- grading verdicts -----------------------------------------------------------------

  // Grading's verdicts (swe_rl.grading.Verdict) in the order the page lists them. Only
  // "resolved" earns the reward; a verdict this page does not know is shown as written.
  const VERDICTS = [
    ["resolved", "resolved", "ok"],
    ["unresolved", "unresolved", "warn"],
    ["change_refused", "change refused", "bad"],
    ["tests_timed_out", "tests timed out", "bad"],
    ["collection_error", "collection error", "bad"],
    ["no_report", "no report", "bad"],
  ];
  const VERDICT = new Map(VERDICTS.map(([code, label, tone]) => [code, { label, tone }]));
  const PASSING = new Set(["passed", "xpassed", "xfailed"]); // grading's PASSING_STATUSES
  const TEST_ORDER = ["failed", "error", "missing", "skipped"]; // then any other, then passing

  function verdictLabel(verdict) {
    if (verdict === null) return "not graded";
    const known = VERDICT.get(verdict);
    return known ? known.label : verdict ? String(verdict).replace(/_/g, " ") : "no verdict";
  }

  function verdictTone(verdict) {
    if (verdict === null) return "none";
    const known = VERDICT.get(verdict);
    return known ? known.tone : "bad";
  }

  function verdictPill(g) {
    const verdict = g ? g.verdict : null;
    const late = g && g.timed_out && verdict !== "tests_timed_out" ? " (timed out)" : "";
    const pill = h("span", "pill verdict " + verdictTone(verdict), verdictLabel(verdict) + late);
    pill.dataset.verdict = verdict === null ? "" : verdict;
    pill.title = g
      ? "grading: " + (g.reason || verdictLabel(verdict)) + (g.timed_out ? " (the test run timed out)" : "")
      : "This episode was not graded.";
    return pill;
  }

  function refusedOf(g) {
    return g && g.refused_paths ? Object.entries(g.refused_paths) : [];
  }

  function refusedFlag(refused) {
    const el = h("span", "refused", refused.length + " refused");
    el.title = "The grader did not apply " + (refused.length === 1 ? "this file" : "these files") +
      " of the agent's change:\n" + refused.map(([path, why]) => path + ": " + why).join("\n");
    return el;
  }

  function testRank(status) {
    const i = TEST_ORDER.indexOf(status);
    return i >= 0 ? i : PASSING.has(status) ? TEST_ORDER.length + 1 : TEST_ORDER.length;
  }

  function verdictCounts() {
    const counts = new Map();
    for (const c of RUN.episodes) {
      const v = c.grading ? c.grading.verdict : null;
      counts.set(v, (counts.get(v) || 0) + 1);
    }
    const order = VERDICTS.map(([code]) => code);
    const rank = (v) => v === null ? order.length + 1 : order.indexOf(v) >= 0 ? order.indexOf(v) : order.length;
    return [...counts.entries()].sort((a, b) => rank(a[0]) - rank(b[0]));
  }

  // ---- tooltip --------------------------------------------------------------------------

  function showTip(target, rows) {
    tip.replaceChildren(...rows);
    tip.classList.add("show");
    const box = target.getBoundingClientRect();
    const width = tip.offsetWidth;
    const height = tip.offsetHeight;
    let left = Math.min(box.left, window.innerWidth - width - 8);
    let top = box.bottom + 6;
    if (top + height > window.innerHeight - 4) top = box.top - height - 6;
    tip.style.left = Math.max(4, left) + "px";
    tip.style.top = Math.max(4, top) + "px";
  }

  function hideTip() {
    tip.classList.remove("show");
  }

  function row(...parts) {
    const el = h("div", "row");
    for (const p of parts) el.append(typeof p === "string" ? document.createTextNode(p) : p);
    return el;
  }

  // ---- run header -----------------------------------------------------------------------

  function runHeader(root) {
    const cards = RUN.episodes;
    root.append(h("h1", null, RUN.title));
    const sub = h("div", "sub");
    const conv = RUN.conversion;
    sub.append(
      "policy ", h("b", null, RUN.policy), " \u00b7 agent ", h("b", null, RUN.agent),
      " \u00b7 samples cut with reward policy ", h("b", null, conv.reward_policy),
      conv.max_sample_tokens === null
        ? " and no length limit"
        : ", length limit " + fmt(conv.max_sample_tokens) + " (" + conv.length_mode + ")"
    );
    root.append(sub);

    const rewards = cards.map((c) => c.reward);
    const mean = rewards.length ? rewards.reduce((a, b) => a + b, 0) / rewards.length : null;
    const total = (key) => cards.reduce((n, c) => n + (c.stats ? c.stats[key] : 0), 0);
    const counts = statusCounts();
    const stopped = cards.filter((c) => c.stopped).length;
    const tiles = h("div", "tiles");
    for (const [v, k] of [
      [fmt(cards.length), "episodes"],
      [fmt(counts.completed || 0), "completed"],
      [fmt(counts.truncated || 0), "truncated"],
      [fmt(counts.aborted || 0), stopped ? "aborted (" + fmt(stopped) + " interrupted)" : "aborted"],
      [mean === null ? "\u2014" : mean.toFixed(3), "mean reward"],
      [fmt(total("turns")), "model calls"],
      [fmt(total("generated_tokens")), "tokens generated"],
      [fmt(total("trained_tokens")), "tokens trained"],
    ]) {
      const t = h("div", "tile");
      t.append(h("div", "v", v), h("div", "k", k));
      tiles.append(t);
    }
    if (cards.some((c) => c.grading)) tiles.append(...gradingTiles());
    root.append(tiles);

    if (RUN.interrupted) {
      const el = h("div", "interrupted");
      el.append(
        h("b", null, "Interrupted."),
        " This run was stopped (Ctrl-C or SIGTERM) before it finished: " +
          (stopped === 1 ? "1 episode was" : fmt(stopped) + " episodes were") +
          " cut short and recorded as aborted with reason \u201cinterrupted\u201d. They have no " +
          "outcome, are never trained and count towards no silent-failure alarm; " +
          (cards.length - stopped === 1
            ? "the 1 other finished, its samples written."
            : "the " + fmt(cards.length - stopped) + " others finished, their samples written.")
      );
      root.append(el);
    }
    if (!RUN.alarms.length) {
      root.append(h("div", "calm", RUN.interrupted
        ? "No silent-failure alarm tripped in the episodes that finished."
        : "No silent-failure alarm tripped in this run."));
    }
    for (const alarm of RUN.alarms) {
      const el = h("div", "alarm");
      el.title = "Show only the episodes behind this alarm";
      el.append(
        h("span", null, "\u26a0"),
        h("span", "gate", alarm.gate),
        h("span", "nums", (100 * alarm.share).toFixed(0) + "% of episodes > limit " +
          (100 * alarm.limit).toFixed(0) + "%"),
        h("span", null, alarm.message)
      );
      el.addEventListener("click", () => {
        filters.gate = filters.gate === alarm.gate ? null : alarm.gate;
        for (const other of document.querySelectorAll(".alarm")) other.classList.remove("active");
        if (filters.gate) el.classList.add("active");
        applyEpisodeFilters();
      });
      root.append(el);
    }
  }

  function gradingTiles() {
    const verdicts = h("div", "tile verdicts");
    verdicts.dataset.tile = "verdicts";
    const list = h("div", "v");
    verdictCounts().forEach(([verdict, n], i) => {
      if (i) list.append(" \u00b7 ");
      const item = h("span", "vc " + verdictTone(verdict));
      item.dataset.verdict = verdict === null ? "" : verdict;
      item.append(h("b", null, fmt(n)), " " + verdictLabel(verdict));
      list.append(item);
    });
    verdicts.append(list, h("div", "k", "grading verdicts"));
    const refused = RUN.episodes.filter((c) => refusedOf(c.grading).length);
    const files = h("div", "tile" + (refused.length ? " alert" : ""));
    files.dataset.tile = "refused";
    files.append(h("div", "v", fmt(refused.length)), h("div", "k", "episodes with refused files"));
    files.title = refused.length
      ? "The grader did not apply some files of these episodes' changes: " +
        refused.map((c) => c.episode_id).join(", ")
      : "The grader applied every file of every change it graded.";
    return [verdicts, files];
  }

  function statusCounts() {
    const counts = {};
    for (const c of RUN.episodes) counts[c.status] = (counts[c.status] || 0) + 1;
    return counts;
  }

  function toolbar(root) {
    const bar = h("div", "toolbar");
    const status = h("div", "group");
    status.append(h("span", "k", "Episodes"));
    const counts = statusCounts();
    for (const name of ["all", "completed", "truncated", "aborted"]) {
      const n = name === "all" ? RUN.episodes.length : counts[name] || 0;
      const chip = h("button", "chip status" + (name === "all" ? " on" : ""));
      chip.append(name, h("span", "n", fmt(n)));
      chip.dataset.status = name;
      chip.addEventListener("click", () => {
        filters.status = name;
        for (const c of bar.querySelectorAll(".chip.status")) {
          c.classList.toggle("on", c === chip);
        }
        applyEpisodeFilters();
      });
      status.append(chip);
    }

    const mode = h("div", "group");
    mode.append(h("span", "k", "Colour"));
    for (const [name, label] of [["reason", "by reason"], ["mask", "by loss mask"]]) {
      const chip = h("button", "chip mode" + (name === "reason" ? " on" : ""), label);
      chip.dataset.mode = name;
      chip.addEventListener("click", () => {
        document.body.classList.toggle("mode-mask", name === "mask");
        for (const c of bar.querySelectorAll(".chip.mode")) c.classList.toggle("on", c === chip);
      });
      mode.append(chip);
    }

    const legend = h("div", "group");
    legend.append(h("span", "k", "Reasons (click to hide)"));
    const tokens = reasonTotals();
    for (const r of RUN.legend) {
      const chip = h("button", "chip reason");
      chip.dataset.reason = r.code;
      const excluded = tokens.excluded[r.code] || 0;
      chip.title = r.description + (r.trained ? " Loss 1." : " Loss 0.") + " " +
        fmt(tokens.shown[r.code] || 0) + " tokens in the run's samples" +
        (excluded ? "; " + fmt(excluded) + " generated tokens excluded for this reason." : ".");
      const sw = h("span", "swatch r-" + r.code);
      chip.append(sw, r.label, h("span", "n", fmt(tokens.shown[r.code] || 0)));
      chip.addEventListener("click", () => {
        const hidden = document.body.classList.toggle("hide-" + r.code);
        chip.classList.toggle("off", hidden);
      });
      legend.append(chip);
    }
    bar.append(status, mode, legend);
    root.append(bar);
    root.append(maskedExplained(tokens));
  }

  function maskedExplained(tokens) {
    // Why the samples' tokens are masked, in words, for the reasons this run has: most of a
    // sample is prompt (the agent CLI's system prompt and tool schemas), never trained.
    const box = h("div", "masked-why");
    const episodes = RUN.episodes.filter((c) => c.stats).length;
    const trained = tokens.shown.generated || 0;
    const all = Object.values(tokens.shown).reduce((a, b) => a + b, 0);
    box.append(h("div", "mw-head",
      "The samples hold " + fmt(all) + " tokens: " + fmt(trained) + " trained (loss 1, " +
      "generated by the engine), " + fmt(all - trained) + " masked (loss 0), each for its " +
      "reason. Only what the model generated is trained; the rest is what it read."));
    const list = h("dl", "mw-list");
    for (const r of RUN.legend) {
      const n = tokens.shown[r.code] || 0;
      const excluded = tokens.excluded[r.code] || 0;
      if (r.trained || (!n && !excluded)) continue;
      const term = h("dt");
      term.dataset.reason = r.code;
      term.append(h("span", "swatch r-" + r.code), r.label);
      const counts = [];
      if (n) {
        counts.push(fmt(n) + " masked" + (episodes > 1
          ? " (about " + fmt(Math.round(n / episodes)) + " per episode)" : ""));
      }
      if (excluded) counts.push(fmt(excluded) + " generated tokens excluded");
      const desc = h("dd");
      desc.append(h("span", "n", counts.join("; ") + ". "), r.description);
      list.append(term, desc);
    }
    if (list.children.length) box.append(list);
    return box;
  }

  function reasonTotals() {
    // Tokens of each reason across the samples of the run, and generated tokens excluded.
    const shown = {}, excluded = {};
    const add = (into, k, v) => { into[k] = (into[k] || 0) + v; };
    for (const c of RUN.episodes) {
      if (!c.stats) continue;
      add(shown, "generated", c.stats.trained_tokens);
      for (const [k, v] of Object.entries(c.stats.masked_tokens)) add(shown, k, v);
      for (const [k, v] of Object.entries(c.stats.excluded_tokens)) add(excluded, k, v);
    }
    return { shown, excluded };
  }

  function applyEpisodeFilters() {
    for (const card of document.querySelectorAll(".episode")) {
      const c = RUN.episodes[Number(card.dataset.index)];
      const status = filters.status === "all" || c.status === filters.status;
      const gate = !filters.gate || c.flags.some((f) => f.gate === filters.gate);
      card.classList.toggle("hidden", !(status && gate));
    }
  }

  // ---- episode cards --------------------------------------------------------------------

  function episodeCard(c, index) {
    const card = h("section", "episode");
    card.dataset.index = String(index);
    card.dataset.episode = c.episode_id;
    const head = h("button", "ep-head");
    head.setAttribute("aria-expanded", "false");
    const inst = h("div", "ep-inst");
    inst.append(c.instance_id + " ", h("span", "grp", "\u00b7 group " + c.group));
    const flags = h("div", "flags");
    if (c.error) flags.append(h("span", "flag error", "error"));
    for (const f of c.flags) {
      const el = h("span", "flag", f.text);
      el.title = "silent-failure gate: " + f.gate;
      flags.append(el);
    }
    const reward = h("div", "num");
    reward.append(h("span", "k", "reward"), h("span", "v", c.reward.toFixed(2)));
    const adv = h("div", "num");
    const advClass = c.advantage > 0 ? "v pos" : c.advantage < 0 ? "v neg" : "v";
    adv.append(h("span", "k", "advantage"), h("span", advClass, signed(c.advantage, 2)));
    const meta = h("div", "ep-meta");
    meta.textContent = c.stats
      ? fmt(c.stats.turns) + " calls \u00b7 " + fmt(c.stats.samples) + " samples \u00b7 " +
        fmt(c.stats.trained_tokens) + " trained"
      : c.stopped ? "stopped before it finished" : "no session tree";
    const grade = h("div", "ep-grade");
    grade.append(verdictPill(c.grading));
    const refused = refusedOf(c.grading);
    if (refused.length) grade.append(refusedFlag(refused));
    const pill = c.stopped
      ? h("span", "pill st-interrupted", "interrupted")
      : h("span", "pill st-" + c.status, c.status);
    if (c.stopped) pill.title = "aborted: stopped by the run's interrupt before it finished";
    head.append(
      h("span", "chev", "\u25b8"),
      pill,
      grade,
      h("span", "ep-id", c.episode_id),
      inst, flags, reward, adv, meta
    );
    const body = h("div", "ep-body");
    body.hidden = true;
    head.addEventListener("click", () => {
      const open = body.hidden;
      if (open && !body.dataset.built) {
        body.dataset.built = "1";
        try {
          episodeBody(body, c, index);
        } catch (error) {
          body.append(h("div", "note bad", "Could not show this episode: " + error));
        }
      }
      body.hidden = !open;
      card.classList.toggle("open", open);
      head.setAttribute("aria-expanded", String(open));
    });
    card.append(head, body);
    return card;
  }

  function episodeBody(body, c, index) {
    const ep = detail(index);
    if (c.error) body.append(h("div", "note bad", c.error));
    const graded = c.grading && c.grading.reason === c.reason; // the Grading section says it
    if (c.stopped) {
      body.append(h("div", "note warn",
        "Stopped by the interrupt before it finished: the run recorded no outcome for this " +
        "episode, so it is never trained and counts towards no silent-failure alarm."));
    } else if (c.reason && !(graded && c.status === "completed")) {
      const tone = c.status === "completed" ? "note" : "note warn";
      body.append(h("div", tone, c.status + ": " + c.reason));
    }
    if (ep.trains === false) {
      body.append(h("div", "note bad",
        "This episode was aborted: slime receives one placeholder sample and trains none of " +
        "the tokens below (they are shown greyed, as recorded)."));
    }
    body.append(h("h3", null, "Grading"), gradingSection(c.grading));
    if (c.stats) {
      body.append(h("h3", null, "Accounting"));
      body.append(facts(c, ep));
      body.append(h("h3", null, "Branches"));
      const panel = h("div", "turn-panel empty",
        "Click a turn in the diagram or the table to see its request, reply, tool calls and results.");
      const ctx = { c, ep, index, panel, svg: null };
      body.append(diagram(ctx), dotsLegend(), panel);
      body.append(h("h3", null, "Samples (" + ep.samples.length + ")"));
      if (!ep.samples.length) {
        body.append(h("div", "note", "No sample: nothing generated survived linearization."));
      }
      for (const sample of ep.samples) body.append(sampleBlock(ctx, sample));
      body.append(turnsSection(ctx));
    }
    body.append(artifacts(ep.artifacts));
  }

  function gradingSection(g) {
    const box = h("div", "grading");
    if (!g) {
      box.append(h("div", "note", "Not graded: the run records no grading for this episode."));
      return box;
    }
    const line = h("div", "grade-line");
    line.append(verdictPill(g), h("span", "grade-reason", g.reason || "(no reason recorded)"));
    box.append(line);
    if (g.timed_out) box.append(h("div", "note warn", "The test run passed its time limit."));

    const refused = refusedOf(g);
    if (refused.length) {
      box.append(h("div", "grade-k",
        (refused.length === 1 ? "1 file" : refused.length + " files") +
        " of the agent's change refused: the grader did not apply " +
        (refused.length === 1 ? "it" : "them")));
      const table = h("table", "grade-table refused-paths");
      const head = h("tr");
      head.append(h("th", null, "path"), h("th", null, "why it was refused"));
      const thead = h("thead");
      thead.append(head);
      const tbody = h("tbody");
      for (const [path, why] of refused) {
        const tr = h("tr");
        tr.append(h("td", "mono path", path), h("td", null, why));
        tbody.append(tr);
      }
      table.append(thead, tbody);
      box.append(table);
    }

    const tests = Object.entries(g.tests || {}).map(([id, status], i) => [id, status, i]);
    tests.sort((a, b) => testRank(a[1]) - testRank(b[1]) || a[2] - b[2]);
    const passing = Number(g.tests_passing) || 0;
    const byStatus = new Map();
    for (const [, status] of tests) byStatus.set(status, (byStatus.get(status) || 0) + 1);
    const parts = [...byStatus.entries()]
      .sort((a, b) => testRank(a[0]) - testRank(b[0]))
      .map(([status, n]) => fmt(n) + " " + status);
    if (passing > 0) parts.push("+" + fmt(passing) + " passing not listed");
    box.append(h("div", "grade-k tests-summary",
      tests.length || passing ? "Tests: " + parts.join(" \u00b7 ") : "No test outcome was recorded."));
    if (tests.length) {
      const scroll = h("div", "grade-tests");
      const table = h("table", "grade-table tests");
      const head = h("tr");
      head.append(h("th", null, "test"), h("th", null, "status"));
      const thead = h("thead");
      thead.append(head);
      const tbody = h("tbody");
      for (const [id, status] of tests) {
        const tr = h("tr");
        const tone = PASSING.has(status) ? "ok" : status === "skipped" ? "warn" : "bad";
        const cell = h("td");
        cell.append(h("span", "ts " + tone, status));
        tr.append(h("td", "mono", id), cell);
        tbody.append(tr);
      }
      table.append(thead, tbody);
      scroll.append(table);
      box.append(scroll);
    }
    return box;
  }

  function facts(c, ep) {
    const st = c.stats;
    const grid = h("div", "facts");
    const excluded = Object.entries(st.excluded_tokens);
    const items = [
      [fmt(st.turns), "model calls"],
      [fmt(st.branches), "branches"],
      [fmt(st.samples), "samples"],
      [fmt(st.generated_tokens), "tokens generated"],
      [fmt(st.trained_tokens), "tokens trained" + (ep.trains === false ? " (aborted)" : "")],
      [fmt(excluded.reduce((n, [, v]) => n + v, 0)), "generated, never trained"],
      [fmt(st.tool_calls), "tool calls"],
      [fmt(st.malformed_tool_calls), "malformed tool calls"],
      [fmt(st.aborted_turns), "aborted calls"],
      [fmt(st.rerendered_turns), "re-rendered prompts"],
      [fmt(st.max_prompt_tokens), "longest prompt"],
    ];
    for (const [reason, n] of excluded) items.push([fmt(n), "excluded: " + reasonLabel(reason)]);
    const masked = Object.entries(st.masked_tokens);
    for (const [reason, n] of masked) items.push([fmt(n), "masked: " + reasonLabel(reason), reason]);
    for (const [v, k, reason] of items) {
      const f = h("div", "fact");
      f.append(h("div", "v", v), h("div", "k", k));
      if (reason) {
        f.dataset.masked = reason;
        const legend = LEGEND.get(reason);
        if (legend) f.title = legend.description;
      }
      grid.append(f);
    }
    if (ep.tools.length) {
      const f = h("div", "fact");
      const names = [...new Set(ep.tools)];
      f.append(h("div", "v", names.length), h("div", "k", "tools offered: " + names.join(", ")));
      grid.append(f);
    }
    return grid;
  }

  // ---- branch diagram -------------------------------------------------------------------

  function turnStatus(ep, turn) {
    if (ep.trains === false) return "untrained";
    const whole = turn.excluded.find(([reason, n]) => n === turn.output_tokens && n > 0);
    if (whole) return whole[0];
    if (turn.trained_in !== null) return turn.excluded.length ? "partial" : "trained";
    if (turn.excluded.length) return turn.excluded[0][0];
    return "context-only";
  }

  const STATUS_TEXT = {
    trained: "trained",
    partial: "trained in part (the rest cut by the length limit)",
    "context-only": "not trained in any sample",
    untrained: "not trained (episode aborted)",
  };

  function statusText(ep, turn) {
    const st = turnStatus(ep, turn);
    if (st === "trained" || st === "partial") return STATUS_TEXT[st] + " in sample " + turn.trained_in;
    return STATUS_TEXT[st] || "excluded: " + reasonLabel(st);
  }

  function diagram(ctx) {
    const { ep } = ctx;
    const wrap = h("div", "diagram");
    const turns = ep.turns;
    if (!turns.length) {
      wrap.append(h("div", "note", "No model call was recorded."));
      return wrap;
    }
    const lanes = 1 + Math.max(...turns.map((t) => t.lane));
    const left = 18;
    const width = Math.max(640, document.querySelector("main").clientWidth - 120);
    const dx = Math.max(12, Math.min(64, Math.floor((width - left - 40) / turns.length)));
    const laneH = 34;
    const top = 24;
    const W = left + dx * turns.length + 40;
    const H = top + lanes * laneH + 4;
    const svg = s("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H });
    ctx.svg = svg;
    const x = (t) => left + dx * t + dx / 2;
    const y = (lane) => top + lane * laneH + laneH / 2;
    for (let l = 0; l < lanes; l++) {
      svg.append(s("line", { class: "lane", x1: 0, x2: W, y1: y(l), y2: y(l) }));
    }
    const step = Math.max(1, Math.ceil(44 / dx));
    const nice = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000];
    const tick = nice.find((n) => n >= step) || step;
    for (let t = 0; t < turns.length; t += tick) {
      svg.append(s("text", { class: "axis", x: x(t), y: 12, "text-anchor": "middle" }, t));
    }
    for (const turn of turns) {
      if (turn.parent === null) continue;
      const p = turns[turn.parent];
      const x0 = x(p.id), y0 = y(p.lane), x1 = x(turn.id), y1 = y(turn.lane);
      const bend = [x0 + dx * 0.8, y0, x1 - dx * 0.8, y1, x1, y1];
      const d = "M" + x0 + " " + y0 + (y0 === y1 ? "L" + x1 + " " + y1 : "C" + bend.join(" "));
      const edge = s("path", { class: "edge", d });
      edge.dataset.turn = String(turn.id);
      svg.append(edge);
    }
    // A line's label sits above its first dot, cut to the room before the next label of its
    // row (the whole label is in the dot's tooltip).
    const starts = turns.filter((t) => t.start !== null);
    for (const turn of starts) {
      const next = starts.find((t) => t.lane === turn.lane && t.id > turn.id);
      const room = (next ? x(next.id) : W + 200) - x(turn.id) - 10;
      const chars = Math.floor(room / 6);
      if (chars < 4) continue;
      const label = turn.start.length > chars ? turn.start.slice(0, chars - 1) + "\u2026" : turn.start;
      const text = s("text", { class: "start", x: x(turn.id) - 4, y: y(turn.lane) - 10 }, label);
      svg.append(text);
    }
    for (const turn of turns) {
      const cls = "dot " + turnStatus(ep, turn) + (turn.parent === null ? " root" : "");
      const r = turn.parent === null ? 6 : 5;
      const dot = s("circle", { class: cls, cx: x(turn.id), cy: y(turn.lane), r });
      dot.dataset.turn = String(turn.id);
      svg.append(dot);
    }
    svg.addEventListener("mouseover", (event) => {
      const t = event.target.dataset && event.target.dataset.turn;
      if (t === undefined || !event.target.classList.contains("dot")) return;
      showTip(event.target, turnTip(ep, turns[Number(t)]));
    });
    svg.addEventListener("mouseout", hideTip);
    svg.addEventListener("click", (event) => {
      const t = event.target.dataset && event.target.dataset.turn;
      if (t !== undefined && event.target.classList.contains("dot")) selectTurn(ctx, Number(t));
    });
    wrap.append(svg);
    return wrap;
  }

  function dotsLegend() {
    // Tiny copies of the diagram's dots, styled by the same classes.
    const el = h("div", "dots-legend");
    for (const [cls, label] of [
      ["trained", "trained"], ["partial", "partly cut by length"], ["context-only", "not trained"],
      ["aborted", "aborted"], ["abandoned_retry", "abandoned retry"], ["side_request", "side request"],
      ["history_dropped", "history dropped"],
      ["untrained", "episode aborted"], ["trained root", "starts a conversation at the root"],
    ]) {
      const item = h("span");
      const icon = s("svg", { width: 14, height: 14, viewBox: "0 0 14 14" });
      icon.append(s("circle", { class: "dot " + cls, cx: 7, cy: 7, r: 5 }));
      item.append(icon, label);
      el.append(item);
    }
    return el;
  }

  function turnTip(ep, turn) {
    const reply = ep.nodes[turn.node].message;
    const calls = reply.content.filter((b) => b.type === "tool_call").map((b) => b.name);
    const rows = [
      row(h("b", null, "turn " + turn.id), " \u00b7 " + agentName(turn.agent)),
      row(fmt(turn.prompt_tokens) + " prompt \u2192 " + fmt(turn.output_tokens) +
        " output tokens \u00b7 finish " + turn.finish),
      row(calls.length ? "tool calls: " + calls.join(", ") : "no tool call"),
      row(statusText(ep, turn)),
    ];
    if (turn.start) rows.push(row(h("span", "dim", "starts a line: " + turn.start)));
    if (turn.rerendered) rows.push(row(h("span", "dim", "re-rendered: " + turn.rerendered)));
    return rows;
  }

  // ---- turn detail ----------------------------------------------------------------------

  function selectTurn(ctx, id) {
    const { ep, panel, svg } = ctx;
    const turn = ep.turns[id];
    if (svg) {
      for (const d of svg.querySelectorAll(".dot.selected")) d.classList.remove("selected");
      const dot = svg.querySelector('.dot[data-turn="' + id + '"]');
      if (dot) dot.classList.add("selected");
    }
    panel.className = "turn-panel";
    panel.replaceChildren();
    const title = h("div", "turn-title");
    const status = turnStatus(ep, turn);
    const tone = status === "trained" ? "completed"
      : status === "aborted" || status === "abandoned_retry" ? "aborted" : "truncated";
    title.append(h("b", null, "Turn " + id), h("span", "pill st-" + tone, statusText(ep, turn)));
    const target = turn.trained_in !== null ? turn.trained_in
      : turn.context_in.length ? turn.context_in[0] : null;
    if (target !== null) {
      const go = h("button", "link", "show its tokens in sample " + target + " \u2192");
      go.addEventListener("click", () => revealTurn(ctx, target, id));
      title.append(go);
    }
    panel.append(title);
    const bits = [
      agentName(turn.agent),
      fmt(turn.prompt_tokens) + " prompt tokens",
      fmt(turn.output_tokens) + " output tokens",
      "finish " + turn.finish,
    ];
    if (turn.request_id) bits.push("request " + turn.request_id);
    if (turn.retry_count) bits.push("client retry #" + turn.retry_count);
    if (turn.weight_version) bits.push("weights " + turn.weight_version);
    if (turn.started_at && turn.finished_at) {
      bits.push((turn.finished_at - turn.started_at).toFixed(2) + " s");
    }
    if (turn.side_request) bits.push("side request");
    if (turn.malformed_tool_calls) bits.push(turn.malformed_tool_calls + " malformed tool calls");
    if (turn.start) bits.push("starts a line: " + turn.start);
    if (turn.parent !== null) bits.push("continues turn " + turn.parent);
    panel.append(h("div", "turn-facts", bits.join(" \u00b7 ")));
    if (turn.rerendered) {
      panel.append(h("div", "note warn", "Prompt re-rendered in full: " + turn.rerendered));
    }

    const added = requestMessages(ep, turn);
    const plural = added.length === 1 ? "" : "s";
    panel.append(h("h3", null, "Request adds " + added.length + " message" + plural));
    for (const m of added) panel.append(messageBlock(m));
    panel.append(h("h3", null, "Reply"));
    panel.append(replyBlock(ep, turn));
    const tokens = h("details", "section");
    tokens.append(h("summary", null, "The tokens this turn added: generation prompt and output (" +
      fmt(ep.nodes[turn.node].tokens.length) + ")"));
    tokens.addEventListener("toggle", () => {
      if (tokens.open && !tokens.dataset.built) {
        tokens.dataset.built = "1";
        new TokenView(ctx, turnSequence(ep, turn), tokens);
      }
    });
    panel.append(tokens);
    panel.scrollIntoView({ block: "nearest" });
  }

  function requestMessages(ep, turn) {
    // The messages between the turn this one continues (or the root) and this turn's reply.
    const out = [];
    let node = ep.nodes[turn.node].parent;
    while (node !== null && ep.nodes[node].turn === null) {
      const n = ep.nodes[node];
      if (n.message) out.push(n.message);
      node = n.parent;
    }
    return out.reverse();
  }

  function textBlock(text, cls) {
    const el = h("div", "text" + (cls ? " " + cls : ""), text);
    if (text.length > 1200 || text.split("\n").length > 12) {
      el.classList.add("clamped");
      const more = h("button", "link", "show all (" + fmt(text.length) + " characters)");
      more.addEventListener("click", () => {
        el.classList.remove("clamped");
        more.remove();
      });
      const box = h("div");
      box.append(el, more);
      return box;
    }
    return el;
  }

  function messageBlock(m) {
    const el = h("div", "msg " + m.role);
    let role = m.role;
    if (m.role === "tool") role += " result for " + m.tool_call_id + (m.is_error ? " (error)" : "");
    el.append(h("div", "role", role));
    for (const b of m.content) el.append(blockView(b));
    return el;
  }

  function blockView(b) {
    if (b.type === "text") return textBlock(b.text);
    if (b.type === "reasoning") return textBlock(b.text, "thinking");
    if (b.type === "tool_call") return callView(b, null);
    return h("div", "text", "[" + b.media_type + "]");
  }

  function callView(call, result) {
    const el = h("div", "call");
    const head = h("div");
    head.append(h("span", "name", call.name), h("span", "mono", " " + call.id));
    let args = call.arguments;
    try {
      args = JSON.stringify(JSON.parse(call.arguments), null, 2);
    } catch (error) {
      head.append(h("span", "bad", "arguments are not valid JSON"));
    }
    el.append(head, textBlock(args));
    if (result) {
      const r = h("div", "result" + (result.is_error ? " err" : ""));
      r.append(h("div", "role", result.is_error ? "result (error)" : "result"));
      for (const b of result.content) r.append(blockView(b));
      el.append(r);
    } else {
      el.append(h("div", "turn-facts", "no result recorded in this tree"));
    }
    return el;
  }

  function replyBlock(ep, turn) {
    const reply = ep.nodes[turn.node].message;
    const el = h("div", "msg assistant");
    el.append(h("div", "role", "assistant \u00b7 " + fmt(turn.output_tokens) + " tokens"));
    for (const b of reply.content) {
      if (b.type === "tool_call") {
        const node = turn.results[b.id];
        el.append(callView(b, node === undefined ? null : ep.nodes[node].message));
      } else {
        el.append(blockView(b));
      }
    }
    if (!reply.content.length) el.append(h("div", "turn-facts", "(empty reply)"));
    return el;
  }

  // ---- samples and their tokens ---------------------------------------------------------

  function sampleBlock(ctx, sample) {
    const { ep, index } = ctx;
    const el = h("div", "sample");
    el.dataset.sample = String(sample.index);
    const head = h("button", "s-head");
    const leaf = ep.turns[sample.leaf_turn];
    const info = h("div", "s-facts");
    info.append(
      h("b", null, fmt(sample.length)), " tokens \u00b7 ",
      h("b", null, fmt(ep.trains === false ? 0 : sample.trained_tokens)), " trained \u00b7 turns ",
      ranges(sample.trained_turns),
      " \u00b7 ends at turn " + sample.leaf_turn + " (" + agentName(leaf.agent) + ")",
      sample.truncated ? " \u00b7 truncated by the length limit" : ""
    );
    head.append(
      h("span", "chev", "\u25b8"), h("span", "s-title", "Sample " + sample.index), info,
      compositionBar(sample, ep.trains !== false)
    );
    const body = h("div", "s-body");
    body.hidden = true;
    head.addEventListener("click", () => toggleSample(ctx, sample, el, body));
    head.addEventListener("mouseenter", () => focusPath(ctx, sample, true));
    head.addEventListener("mouseleave", () => focusPath(ctx, sample, false));
    el.append(head, body);
    return el;
  }

  function toggleSample(ctx, sample, el, body, forceOpen) {
    const open = forceOpen || body.hidden;
    const key = ctx.index + "/" + sample.index;
    if (open && !views.has(key)) {
      views.set(key, new TokenView(ctx, sampleSequence(ctx.index, sample.index), body));
    }
    body.hidden = !open;
    el.classList.toggle("open", open);
    return views.get(key);
  }

  function focusPath(ctx, sample, on) {
    const svg = ctx.svg;
    if (!svg) return;
    svg.classList.toggle("focus", on);
    if (!on) return;
    const turnsOnPath = new Set();
    for (const n of sample.path) if (ctx.ep.nodes[n].turn !== null) turnsOnPath.add(ctx.ep.nodes[n].turn);
    for (const el of svg.querySelectorAll(".dot, .edge")) {
      el.classList.toggle("on", turnsOnPath.has(Number(el.dataset.turn)));
    }
  }

  function ranges(ids) {
    if (!ids.length) return "none";
    const out = [];
    let a = ids[0], b = ids[0];
    for (const i of ids.slice(1).concat([null])) {
      if (i === b + 1) { b = i; continue; }
      out.push(a === b ? String(a) : a + "\u2013" + b);
      a = b = i;
    }
    return out.join(", ");
  }

  function compositionBar(sample, trains) {
    const bar = h("div", "bar" + (trains ? "" : " untrained"));
    const parts = Object.assign({ generated: sample.trained_tokens }, sample.masked_tokens);
    for (const r of RUN.legend) {
      const n = parts[r.code];
      if (!n) continue;
      const seg = h("span", "r-" + r.code);
      seg.style.width = (100 * n / sample.length) + "%";
      seg.title = r.label + ": " + fmt(n) + " tokens";
      bar.append(seg);
    }
    return bar;
  }

  function sampleTokens(episode, sampleIndex) {
    // A sample's tokens are its branch's node tokens, in order, cut to the sample's length.
    const key = episode + "/" + sampleIndex;
    if (!sampleIds.has(key)) {
      const ep = detail(episode);
      const sample = ep.samples[sampleIndex];
      const ids = new Int32Array(sample.length);
      let k = 0;
      for (const n of sample.path) {
        const delta = ep.nodes[n].tokens;
        for (let i = 0; i < delta.length && k < sample.length; i++) ids[k++] = delta[i];
      }
      sampleIds.set(key, ids);
    }
    return sampleIds.get(key);
  }

  function spanAt(spans, pos) {
    let lo = 0, hi = spans.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (spans[mid][0] <= pos) lo = mid; else hi = mid - 1;
    }
    return spans[lo];
  }

  // A run of tokens the page can show: a sample, or the tokens one turn added to the tree.
  // spans are [start, end, reason, node, turn]; turn is set exactly on engine-generated spans.
  function sampleSequence(episode, sampleIndex) {
    const ep = detail(episode);
    const sample = ep.samples[sampleIndex];
    return {
      ep, length: sample.length, spans: sample.spans, first: sample.prompt_length,
      ids: sampleTokens(episode, sampleIndex), markers: true,
      what: "sample " + sampleIndex,
    };
  }

  function turnSequence(ep, turn) {
    const ids = ep.nodes[turn.node].tokens;
    const output = ids.length - turn.output_tokens;
    const spans = [];
    if (output > 0) spans.push([0, output, "template_scaffold", turn.node, null]);
    const whole = turn.excluded.find(([, n]) => n === turn.output_tokens);
    const cut = turn.excluded.find(([reason]) => reason === "over_length");
    if (whole) {
      spans.push([output, ids.length, whole[0], turn.node, turn.id]);
    } else if (cut) { // the length limit cuts the end of a sample, so the end of this output
      spans.push([output, ids.length - cut[1], "generated", turn.node, turn.id]);
      spans.push([ids.length - cut[1], ids.length, "over_length", turn.node, turn.id]);
    } else if (turn.output_tokens) {
      spans.push([output, ids.length, "generated", turn.node, turn.id]);
    }
    return {
      ep, length: ids.length, spans, first: output, ids, markers: false,
      what: "turn " + turn.id + "'s generation prompt and output",
    };
  }

  function infoAt(seq, pos) {
    const [start, , reason, node, turn] = spanAt(seq.spans, pos);
    const id = seq.ids[pos];
    const logprob = turn === null ? null : seq.ep.turns[turn].logprobs[pos - start];
    return {
      position: pos,
      id,
      text: seq.ep.tokens[id],
      reason,
      loss: reason === "generated" && seq.ep.trains !== false ? 1 : 0,
      logprob: logprob === undefined ? null : logprob,
      generated: turn !== null,
      turn,
      node,
    };
  }

  // The facts behind one token's tooltip (also read by scripts that check the page).
  function tokenInfo(episode, sampleIndex, pos) {
    return infoAt(sampleSequence(episode, sampleIndex), pos);
  }

  class TokenView {
    constructor(ctx, seq, host) {
      this.ctx = ctx;
      this.seq = seq;
      this.ids = seq.ids;
      this.pos = 0;
      this.span = 0;
      const tools = h("div", "s-tools");
      if (seq.markers) {
        const trains = seq.ep.trains !== false;
        const what = trains ? "trained" : "generated";
        const first = h("button", "link", "jump to the first " + what + " token");
        first.addEventListener("click", () => this.revealPosition(seq.first));
        tools.append(first);
      }
      this.all = h("button", "link", "render all " + fmt(seq.length) + " tokens");
      this.all.addEventListener("click", () => this.renderAll());
      tools.append(this.all, h("span", null, "hover a token for its id, logprob and reason"));
      this.box = h("div", "tokens" + (seq.ep.trains === false ? " untrained" : ""));
      this.more = h("div", "more");
      host.append(tools, this.box);
      this.observer = new IntersectionObserver((entries) => {
        if (entries.some((e) => e.isIntersecting)) this.step();
      }, { root: this.box, rootMargin: "400px" });
      this.box.addEventListener("mouseover", (event) => this.hover(event));
      this.box.addEventListener("mouseout", hideTip);
      this.box.addEventListener("click", (event) => {
        const marker = event.target.closest(".tm");
        if (marker) selectTurn(this.ctx, Number(marker.dataset.turn));
      });
      this.step();
    }

    get done() {
      return this.pos >= this.seq.length;
    }

    step() {
      if (this.done) return;
      this.observer.unobserve(this.more);
      this.more.remove();
      const fragment = document.createDocumentFragment();
      const limit = Math.min(this.seq.length, this.pos + CHUNK);
      const texts = this.seq.ep.tokens;
      const trains = this.seq.ep.trains !== false;
      while (this.pos < limit) {
        const [start, end, reason, , turn] = this.seq.spans[this.span];
        if (this.pos === start) {
          const hidden = "\u22ef " + fmt(end - start) + " " + reasonLabel(reason) + " tokens";
          fragment.append(h("span", "fold r-" + reason, hidden));
          if (turn !== null && this.seq.markers) {
            const marker = h("span", "tm", "turn " + turn);
            marker.dataset.turn = String(turn);
            marker.title = "turn " + turn + ": click for its request and reply";
            fragment.append(marker);
          }
        }
        const stop = Math.min(end, limit);
        const wrapper = h("span", "sp r-" + reason + (reason === "generated" && trains ? " m1" : ""));
        wrapper.dataset.start = String(this.pos);
        for (let i = this.pos; i < stop; i++) {
          const text = texts[this.ids[i]];
          const token = h("span", "t", text);
          if (text === "") token.classList.add("empty");
          else if (text.indexOf("\n") >= 0 && text.trim() === "") token.classList.add("nl");
          wrapper.append(token);
        }
        fragment.append(wrapper);
        this.pos = stop;
        if (stop === end) this.span += 1;
      }
      this.box.append(fragment);
      if (!this.done) {
        this.more.textContent =
          fmt(this.pos) + " of " + fmt(this.seq.length) + " tokens shown; scroll for more";
        this.box.append(this.more);
        this.observer.observe(this.more);
      } else {
        this.all.remove();
      }
    }

    renderAll() {
      while (!this.done) this.step();
    }

    revealPosition(pos) {
      while (this.pos <= pos && !this.done) this.step();
      for (const wrapper of this.box.querySelectorAll(".sp")) {
        const start = Number(wrapper.dataset.start);
        if (start <= pos && pos < start + wrapper.children.length) {
          const token = wrapper.children[pos - start];
          token.scrollIntoView({ block: "center" });
          token.animate([{ outline: "2px solid #2f5bd3" }, { outline: "2px solid transparent" }], 1600);
          return token;
        }
      }
      return null;
    }

    revealTurn(turn) {
      const span = this.seq.spans.find((sp) => sp[4] === turn);
      if (!span) return null;
      this.revealPosition(span[0]);
      const marker = this.box.querySelector('.tm[data-turn="' + turn + '"]');
      if (marker) {
        marker.scrollIntoView({ block: "center" });
        marker.classList.add("flash");
        setTimeout(() => marker.classList.remove("flash"), 1600);
      }
      return marker;
    }

    hover(event) {
      const token = event.target;
      if (!token.classList || !token.classList.contains("t")) return;
      const wrapper = token.parentNode;
      const offset = Array.prototype.indexOf.call(wrapper.children, token);
      const pos = Number(wrapper.dataset.start) + offset;
      const info = infoAt(this.seq, pos);
      const legend = LEGEND.get(info.reason);
      const rows = [
        row(h("span", "tt", JSON.stringify(info.text))),
        row("id " + info.id + " \u00b7 position " + fmt(pos) + " of " + fmt(this.seq.length) +
          " in " + this.seq.what),
        row(h("b", null, legend ? legend.label : info.reason), " \u00b7 loss " + info.loss +
          (this.seq.ep.trains === false && info.reason === "generated" ? " (episode aborted)" : "")),
        row(h("span", "dim", legend ? legend.description : "")),
      ];
      if (info.generated) {
        const lp = info.logprob;
        rows.push(row("logprob " + (lp === null ? "-inf" : String(lp)) +
          (lp === null ? "" : " \u00b7 p = " + (100 * Math.exp(lp)).toPrecision(3) + "%")));
        rows.push(row(h("span", "dim", "generated in turn " + info.turn + ", node " + info.node)));
      } else {
        rows.push(row(h("span", "dim", "node " + info.node)));
      }
      showTip(token, rows);
    }
  }

  function revealTurn(ctx, sampleIndex, turn) {
    const block = ctx.panel.parentNode.querySelector('.sample[data-sample="' + sampleIndex + '"]');
    const view = toggleSample(ctx, ctx.ep.samples[sampleIndex], block, block.querySelector(".s-body"), true);
    view.revealTurn(turn);
  }

  // ---- turns table and artifacts --------------------------------------------------------

  function turnsSection(ctx) {
    const { ep } = ctx;
    const section = h("details", "section");
    section.append(h("summary", null, "All turns (" + ep.turns.length + ")"));
    section.addEventListener("toggle", () => {
      if (!section.open || section.dataset.built) return;
      section.dataset.built = "1";
      const table = h("table", "turns");
      const head = h("tr");
      const columns = ["turn", "agent", "prompt", "output", "finish", "tool calls", "reply", "training"];
      for (const name of columns) head.append(h("th", null, name));
      const thead = h("thead");
      thead.append(head);
      const tbody = h("tbody");
      for (const turn of ep.turns) {
        const reply = ep.nodes[turn.node].message;
        const calls = reply.content.filter((b) => b.type === "tool_call").map((b) => b.name);
        const text = reply.content.filter((b) => b.type === "text").map((b) => b.text).join(" ");
        const tr = h("tr");
        tr.dataset.turn = String(turn.id);
        tr.append(
          h("td", "num", turn.id), h("td", null, agentName(turn.agent)),
          h("td", "num", fmt(turn.prompt_tokens)), h("td", "num", fmt(turn.output_tokens)),
          h("td", null, turn.finish), h("td", "mono", calls.join(", ")),
          h("td", "preview", text), h("td", null, statusText(ep, turn))
        );
        tr.addEventListener("click", () => selectTurn(ctx, turn.id));
        tbody.append(tr);
      }
      table.append(thead, tbody);
      section.append(table);
    });
    return section;
  }

  function artifacts(found) {
    const box = h("div");
    for (const key of ["diff", "grading_log", "summary"]) {
      const a = found[key];
      if (!a) continue;
      const section = h("details", "section");
      const cut = a.bytes > a.text.length
        ? " \u00b7 first " + fmt(a.text.length) + " characters of " + fmt(a.bytes) + " bytes" : "";
      section.append(h("summary", null, a.name + cut));
      const pre = h("pre", "artifact");
      if (key === "diff") {
        for (const line of a.text.split("\n")) {
          let cls = null;
          if (line.startsWith("diff --git") || line.startsWith("+++") || line.startsWith("---")) cls = "file";
          else if (line.startsWith("@@")) cls = "hunk";
          else if (line.startsWith("+")) cls = "add";
          else if (line.startsWith("-")) cls = "del";
          pre.append(cls ? h("span", cls, line + "\n") : document.createTextNode(line + "\n"));
        }
      } else {
        pre.textContent = a.text;
      }
      section.append(pre);
      box.append(section);
    }
    if (!box.children.length) {
      box.append(h("div", "note", "No diff, grading log or summary was saved for this episode."));
    }
    return box;
  }

  // ---- start ----------------------------------------------------------------------------

  const app = document.getElementById("app");
  app.replaceChildren();
  runHeader(app);
  toolbar(app);
  const list = h("div", "episodes");
  RUN.episodes.forEach((c, i) => list.append(episodeCard(c, i)));
  if (!RUN.episodes.length) list.append(h("div", "note", "This run lists no episode."));
  app.append(list);
  document.body.append(tip);
  window.trajectoryViewer = Object.freeze({ tokenInfo });
  document.documentElement.dataset.ready = "1";
})();
