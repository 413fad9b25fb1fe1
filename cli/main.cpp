#include "commands.hpp"

int main(int argc, char** argv) {
  return dynemb::cli::main_entry(argc, argv);
}
