# How the library is put together (CMakeLists.txt): warnings, one static library per layer,
# files the library carries, the generated list of targets, and the map of layers that
# tests/layers_test.sh checks the sources and the libraries against.

# -Wall -Wextra on one of our targets; errors with -DDEUTERON_WERROR=ON.
function(deuteron_warnings target)
  # -Werror=switch: every switch over the op table (ir/ops.h) covers it, so a new op fails to
  # compile until each target spells it.
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror=switch $<$<BOOL:${DEUTERON_WERROR}>:-Werror>)
endfunction()

# deuteron_layer_files(NAME DEPENDS layer... FILES file...)
# Records which files belong to the layer NAME and which layers it may use, for the layer map.
function(deuteron_layer_files name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "DEPENDS;FILES")
  set_property(GLOBAL APPEND PROPERTY DEUTERON_LAYER_NAMES ${name})
  set_property(GLOBAL PROPERTY DEUTERON_LAYER_DEPENDS_${name} ${arg_DEPENDS})
  set_property(GLOBAL PROPERTY DEUTERON_LAYER_FILES_${name} ${arg_FILES})
endfunction()

# deuteron_layer(NAME [FOLDER dir] [FILES file...] [DEPENDS layer...] [TARGET])
# The library deuteron_NAME (exported as deuteron::NAME) of the folder's .cpp and .h files and
# FILES, linking the layers it DEPENDS on; header-only layers are INTERFACE libraries. TARGET
# marks a target's own library (src/backends/<name>): only the registry may use it.
function(deuteron_layer name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "TARGET" "FOLDER" "FILES;DEPENDS")
  set(files ${arg_FILES})
  if(arg_FOLDER)
    file(GLOB folder_files CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${arg_FOLDER}/*.cpp
         ${PROJECT_SOURCE_DIR}/${arg_FOLDER}/*.h)
    list(APPEND files ${folder_files})
  endif()
  list(TRANSFORM files PREPEND ${PROJECT_SOURCE_DIR}/ REGEX "^[^/]")
  set(sources ${files})
  list(FILTER sources INCLUDE REGEX "\\.cpp$")
  list(TRANSFORM arg_DEPENDS PREPEND deuteron_ OUTPUT_VARIABLE libs)
  set(lib deuteron_${name})
  if(sources)
    add_library(${lib} STATIC ${files})
    target_include_directories(${lib} PRIVATE ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(${lib} PUBLIC ${libs})
    deuteron_warnings(${lib})
  else()
    add_library(${lib} INTERFACE ${files})
    target_link_libraries(${lib} INTERFACE ${libs})
  endif()
  set_target_properties(${lib} PROPERTIES EXPORT_NAME ${name})
  set_property(GLOBAL APPEND PROPERTY DEUTERON_LIBRARIES ${lib})
  if(arg_TARGET)
    set_property(GLOBAL APPEND PROPERTY DEUTERON_TARGET_LAYERS ${name})
  endif()
  deuteron_layer_files(${name} DEPENDS ${arg_DEPENDS} FILES ${files})
endfunction()

# Compiles the text of FILE (relative to the source folder) into TARGET as
# `std::string_view deuteron::embedded::NAME`, so that programs carry it wherever the library
# was built, installed or linked (runtime/disk_cache.h: resource_dir writes it out).
function(deuteron_embed target name file)
  set(input ${PROJECT_SOURCE_DIR}/${file})
  set(output ${PROJECT_BINARY_DIR}/generated/embedded/${name}.cpp)
  add_custom_command(
    OUTPUT ${output}
    COMMAND ${CMAKE_COMMAND} -DINPUT=${input} -DOUTPUT=${output} -DNAME=${name}
            -P ${PROJECT_SOURCE_DIR}/cmake/embed.cmake
    DEPENDS ${input} ${PROJECT_SOURCE_DIR}/cmake/embed.cmake
    COMMENT "Embedding ${file}"
    VERBATIM)
  target_sources(${target} PRIVATE ${output})
endfunction()

# Writes OUTPUT, the registry's list of DEUTERON_TARGETS (cmake/targets.cpp.in), and sets
# DEUTERON_TARGET_LAYERS to their layers. A list rather than static registration objects:
# the registry calls each target's make_backend(), so a static link keeps every target, and
# the order (the default first) is the build's, not the static initialisers'.
function(deuteron_target_list output)
  if(NOT DEUTERON_TARGETS)
    message(FATAL_ERROR "DEUTERON_TARGETS is empty: the library needs at least one target (cpu)")
  endif()
  set(DEUTERON_TARGET_DECLARATIONS "")
  set(DEUTERON_TARGET_CALLS "")
  foreach(t IN LISTS DEUTERON_TARGETS)
    string(APPEND DEUTERON_TARGET_DECLARATIONS
           "namespace deuteron::${t} {\nstd::unique_ptr<backends::Backend> make_backend();\n}\n")
    string(APPEND DEUTERON_TARGET_CALLS "  all.push_back(${t}::make_backend());\n")
  endforeach()
  configure_file(${PROJECT_SOURCE_DIR}/cmake/targets.cpp.in ${output} @ONLY)
  list(TRANSFORM DEUTERON_TARGETS PREPEND backend_ OUTPUT_VARIABLE layers)
  set(DEUTERON_TARGET_LAYERS ${layers} PARENT_SCOPE)
endfunction()

# Writes OUTPUT for tests/layers_test.sh, one record per line:
#   layer <name> <static library or -> <1 if a target's library, else 0> <layers it may use...>
#   file <name> <path of one of its files>
# "May use" is the closure of DEPENDS.
function(deuteron_layer_map output)
  get_property(names GLOBAL PROPERTY DEUTERON_LAYER_NAMES)
  get_property(libraries GLOBAL PROPERTY DEUTERON_LIBRARIES)
  get_property(target_layers GLOBAL PROPERTY DEUTERON_TARGET_LAYERS)
  set(text "")
  foreach(name IN LISTS names)
    get_property(pending GLOBAL PROPERTY DEUTERON_LAYER_DEPENDS_${name})
    set(closure "")
    while(pending)
      list(POP_FRONT pending d)
      if(NOT d IN_LIST closure)
        list(APPEND closure ${d})
        get_property(more GLOBAL PROPERTY DEUTERON_LAYER_DEPENDS_${d})
        list(APPEND pending ${more})
      endif()
    endwhile()
    set(file "-")
    if(deuteron_${name} IN_LIST libraries)
      get_target_property(type deuteron_${name} TYPE)
      if(type STREQUAL "STATIC_LIBRARY")
        set(file "$<TARGET_FILE:deuteron_${name}>")
      endif()
    endif()
    set(is_target 0)
    if(name IN_LIST target_layers)
      set(is_target 1)
    endif()
    list(JOIN closure " " closure)
    string(APPEND text "layer ${name} ${file} ${is_target} ${closure}\n")
    get_property(files GLOBAL PROPERTY DEUTERON_LAYER_FILES_${name})
    foreach(f IN LISTS files)
      file(RELATIVE_PATH f ${PROJECT_SOURCE_DIR} ${f})
      string(APPEND text "file ${name} ${f}\n")
    endforeach()
  endforeach()
  file(GENERATE OUTPUT ${output} CONTENT "${text}")
endfunction()
