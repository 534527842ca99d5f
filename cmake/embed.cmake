# cmake -DINPUT=file -DOUTPUT=file.cpp -DNAME=identifier -P embed.cmake
# Writes a C++ source defining `const std::string_view deuteron::embedded::NAME` with the text
# of INPUT as a raw string literal (deuteron_embed in deuteron_build.cmake). OUTPUT is only
# rewritten when it changes.
file(READ "${INPUT}" text)
string(FIND "${text}" ")deuteron_embed\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains )deuteron_embed\", which ends the raw string it is embedded in")
endif()
file(RELATIVE_PATH shown "${CMAKE_CURRENT_LIST_DIR}/.." "${INPUT}")
file(WRITE "${OUTPUT}.tmp"
     "// Generated from ${shown} by cmake/embed.cmake; do not edit.\n"
     "#include <string_view>\n\n"
     "namespace deuteron::embedded {\n"
     "extern const std::string_view ${NAME};\n"
     "const std::string_view ${NAME} = R\"deuteron_embed(${text})deuteron_embed\";\n"
     "}  // namespace deuteron::embedded\n")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
