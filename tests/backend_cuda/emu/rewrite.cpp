// Turns a CUDA source of backend/cuda/ into C++ for the CPU emulation (moeplan_cuda_emu.hpp):
//   kernel<<<cfg>>>(args)            ->  ::moeplan_emu::launch("kernel",
//                                          Config(cfg).of(kernel_key(kernel)), [=] { kernel(args);
//                                          })
//   extern __shared__ [__align__(n)] T name[];  ->  T* name = dynamic_shared<T>();
// Everything else is kept byte for byte, newlines included, and a #line directive names the
// original file, so that compiler messages and sanitizer reports point at the real source line.
// Usage: moeplan_cuda_rewrite <in.cu> <out.cpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>

namespace {

[[noreturn]] void die(const std::string& what) {
  std::cerr << "moeplan_cuda_rewrite: " << what << "\n";
  std::exit(1);
}

bool ident(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':';
}

// The start of the kernel expression that ends just before `end`: an identifier, optionally
// qualified, optionally with template arguments.
size_t kernel_start(const std::string& s, size_t end) {
  size_t i = end;
  while (i > 0 && std::isspace(static_cast<unsigned char>(s[i - 1]))) --i;
  if (i > 0 && s[i - 1] == '>') {
    int depth = 0;
    while (i > 0) {
      const char c = s[--i];
      if (c == '>') ++depth;
      if (c == '<' && --depth == 0) break;
    }
    if (depth != 0) die("unbalanced template arguments before <<<");
  }
  while (i > 0 && ident(s[i - 1])) --i;
  return i;
}

std::string rewrite_launches(const std::string& s) {
  std::string out;
  size_t pos = 0;
  for (;;) {
    const size_t open = s.find("<<<", pos);
    if (open == std::string::npos) break;
    const size_t kstart = kernel_start(s, open);
    if (kstart < pos) die("kernel expression overlaps an earlier launch");
    const size_t close = s.find(">>>", open);
    if (close == std::string::npos) die("<<< without >>>");
    size_t p = close + 3;
    while (p < s.size() && std::isspace(static_cast<unsigned char>(s[p]))) ++p;
    if (p >= s.size() || s[p] != '(') die("launch without an argument list");
    int depth = 0;
    size_t q = p;
    for (; q < s.size(); ++q) {
      if (s[q] == '(') ++depth;
      if (s[q] == ')' && --depth == 0) break;
    }
    if (q >= s.size()) die("unbalanced launch arguments");
    const std::string kernel = s.substr(kstart, open - kstart);
    const std::string cfg = s.substr(open + 3, close - open - 3);
    const std::string args = s.substr(p + 1, q - p - 1);
    std::string name;
    for (char c : kernel)
      if (c != '"' && c != '\\' && c != '\n') name += c;
    out += s.substr(pos, kstart - pos);
    out += "::moeplan_emu::launch(\"" + name + "\", ::moeplan_emu::Config(" + cfg +
           ").of(::moeplan_emu::kernel_key(" + kernel + ")), [=] { " + kernel + "(" + args +
           "); })";
    pos = q + 1;
  }
  out += s.substr(pos);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) die("usage: moeplan_cuda_rewrite <in.cu> <out.cpp>");
  std::ifstream in(argv[1], std::ios::binary);
  if (!in) die(std::string("cannot read ") + argv[1]);
  std::stringstream buf;
  buf << in.rdbuf();
  std::string s = buf.str();
  const std::regex shared(
      R"(extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?([A-Za-z_][\w:]*(?:\s+[A-Za-z_][\w:]*)*)\s+([A-Za-z_]\w*)\s*\[\s*\]\s*;)");
  s = std::regex_replace(s, shared, "$1* $2 = ::moeplan_emu::dynamic_shared<$1>();");
  s = rewrite_launches(s);
  const std::string tmp = std::string(argv[2]) + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out << "#line 1 \"" << argv[1] << "\"\n" << s;
    if (!out) die(std::string("cannot write ") + tmp);
  }
  if (std::rename(tmp.c_str(), argv[2]) != 0) die(std::string("cannot rename to ") + argv[2]);
  return 0;
}
