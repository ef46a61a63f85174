# Writes a C++ source holding files as byte arrays, for what a binary serves without reading
# the disk (the admin console's pages). Run in script mode:
#   cmake -DOUT=<file.cpp> -DDIR=<folder> -DFILES="a.html;b.js" -DNAMESPACE=<ns> -DHEADER=<h> -P EdgeEmbedFiles.cmake
# The source includes HEADER, which declares, in NAMESPACE,
#   struct embedded_file { std::string_view name; std::string_view bytes; };
#   std::span<const embedded_file> embedded_files();
# and defines embedded_files(): every file, in the order of FILES.
set(body "// Made by cmake/EdgeEmbedFiles.cmake from ${DIR}; edit those files, not this one.\n")
string(APPEND body "#include \"${HEADER}\"\n\n#include <array>\n\n")
string(APPEND body "namespace ${NAMESPACE} {\n\n")
set(table "")
set(index 0)
foreach(name IN LISTS FILES)
  file(READ "${DIR}/${name}" hex HEX)
  string(LENGTH "${hex}" hex_length)
  math(EXPR size "${hex_length} / 2")
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "'\\\\x\\1'," bytes "${hex}")
  string(APPEND body "static constexpr char file_${index}[] = {${bytes} 0};\n")
  string(APPEND table "    embedded_file{\"${name}\", std::string_view(file_${index}, ${size})},\n")
  math(EXPR index "${index} + 1")
endforeach()
string(APPEND body "\nstatic constexpr std::array<embedded_file, ${index}> files{{\n${table}}};\n\n")
string(APPEND body "std::span<const embedded_file> embedded_files() { return files; }\n\n}  // namespace ${NAMESPACE}\n")
file(WRITE "${OUT}.tmp" "${body}")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
