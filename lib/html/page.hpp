// Self-contained HTML pages for the reports (replay --html, load --html): one file, no script
// and no network (a Content-Security-Policy that allows only inline style and data: images),
// inline CSS and inline SVG charts. Every chart comes with its numbers in a <table> (aggregated
// as the chart is), every drawn cell carries an SVG <title> tooltip, and every text put on the
// page goes through esc(): escape_field (common/safe_text.hpp: control characters and invalid
// UTF-8 become \xNN text) and then the HTML metacharacters, in content, attributes and SVG alike.
//
// Large worlds are drawn in blocks: W ranks (or B batches) become at most `max_blocks`
// consecutive blocks of ceil(W / max_blocks) each, labelled "ranks 0-15", so that a page for
// W = 1024 draws the same number of cells as one for W = 64.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dynemb::html {

// Text for an HTML element's content or a quoted attribute value (also inside inline SVG).
std::string esc(std::string_view s);

// "0 B", "512 B", "1.50 KiB", "3.07 MiB": three significant digits from KiB up.
std::string bytes_text(double b);
// 1234567 -> "1,234,567"
std::string int_text(int64_t v);
// A ratio, "1.00", "12.5".
std::string ratio_text(double v);

// "rank" -> "ranks", "batch" -> "batches".
std::string plural(std::string_view noun);

// n items cut into at most `max_blocks` consecutive blocks of `size` items (the last may be
// shorter); size 1 when n <= max_blocks.
struct Blocks {
  int64_t n = 0, size = 1, count = 0;
  Blocks(int64_t n, int64_t max_blocks);
  int64_t begin(int64_t b) const { return b * size; }
  int64_t end(int64_t b) const { return b * size + size < n ? b * size + size : n; }
  // "rank 3" for a block of one, "ranks 0-15" for more (noun singular).
  std::string label(int64_t b, std::string_view noun) const;
  // The same with the items' own numbers (`ids[i]` for item i, e.g. the batches replayed).
  std::string label(int64_t b, std::string_view noun, const std::vector<int64_t>& ids) const;
  // The numbers alone: "3", "0-15".
  std::string range(int64_t b, const std::vector<int64_t>& ids = {}) const;
};

struct Series {
  std::string name;
  std::vector<double> values;  // one per category
};

// Bars of several series side by side per category (e.g. per rank, one bar per plan).
struct BarChart {
  std::string title;
  std::string value_name;               // what a bar measures, e.g. "ids (max over the block)"
  std::string category_name;            // header of the category column, e.g. "ranks"
  std::vector<std::string> categories;  // at most ~64 (aggregate before)
  std::vector<Series> series;
  std::function<std::string(double)> format;  // value text; null: int_text
  bool bytes = false;                         // the axis steps by KiB, MiB, ...
};

// A square matrix (sender-major) drawn as colored cells, aggregated into blocks when large
// (block sums); a color scale with its legend, the numbers in a table under it.
struct HeatMap {
  std::string title;
  int64_t n = 0;
  std::vector<double> cells;      // [n * n], cells[row * n + col]
  std::string row_noun = "rank";  // rows: senders
  std::string col_noun = "rank";  // columns: receivers
  std::string row_role = "from";  // "from rank 3 to rank 5"
  std::string col_role = "to";
  std::function<std::string(double)> format;  // null: int_text
  int64_t max_side = 64;
};

// Cells of rows x columns with a status (an index into `kinds`, worse is higher; -1: none),
// aggregated into blocks when large: a block shows its worst status and counts every status.
struct StatusKind {
  std::string name;   // "pass", "mismatch", ...
  std::string color;  // CSS color, e.g. "#2e7d32"
};
struct StatusGrid {
  std::string title;
  std::string row_noun = "rank", col_noun = "batch";
  int64_t rows = 0, cols = 0;
  std::vector<int64_t> row_ids, col_ids;  // the numbers shown for each (empty: 0, 1, ...)
  std::vector<int> status;                // [rows * cols]
  std::vector<StatusKind> kinds;
  std::string none_name = "not checked";  // a cell of status -1
  // Tooltip of one cell when the grid is drawn unaggregated (null: "rank r, batch c: status").
  std::function<std::string(int64_t row, int64_t col)> tip;
  int64_t max_side = 64;
};

struct Table {
  std::string caption;
  std::vector<std::string> headers;
  std::vector<std::vector<std::string>> rows;  // texts (escaped when written)
  std::vector<bool> numeric;                   // per column: right-aligned
  // Folded into <details> when it has more rows than this (0: never).
  size_t fold_after = 24;
  std::string note;  // a line under the table, e.g. "500 of 6400 shown"
};

enum class Tone { good, bad, warn, neutral };

// A page assembled section by section; str() is the complete document.
class Page {
 public:
  explicit Page(std::string title);
  void heading(std::string_view text, int level = 2);
  void paragraph(std::string_view text, bool muted = false);
  // The verdict banner: a word ("PASS") and a line.
  void banner(std::string_view word, std::string_view line, Tone tone);
  // A definition list of facts (name, value).
  void facts(const std::vector<std::pair<std::string, std::string>>& kv);
  void list(const std::vector<std::string>& items);
  void bar_chart(const BarChart& c);
  void heat_map(const HeatMap& h);
  void status_grid(const StatusGrid& g);
  void table(const Table& t);
  std::string str() const;

 private:
  std::string title_, body_;
  int charts_ = 0;
};

// Writes `page` to `path` through common/output_file (a temporary renamed into place; removed
// on failure or signal). Throws Error / UsageError naming the file.
void write_page(const std::string& page, const std::string& path);

}  // namespace dynemb::html
