# kiln_add_model(<target> MODEL <model> [CONFIG <config>] [SET key=value...]
#                [KIR <file.kir>] [TARGET <halide-target>] [WEIGHTS f32|bf16]
#                [NAME <library-name>])
#
# Emits a registered model's IR (or takes KIR), compiles it with `kiln compile`, and
# defines <target>: a library to link that brings the generated header (<name>.h),
# the static library and kiln's runtime. In the spirit of Halide's add_halide_library.
#
#   kiln_add_model(translator MODEL transformer CONFIG base SET max_len=256)
#   target_link_libraries(app PRIVATE translator)   # then: #include "translator.h"
function(kiln_add_model target)
  cmake_parse_arguments(ARG "" "MODEL;CONFIG;KIR;TARGET;NAME;WEIGHTS" "SET" ${ARGN})
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "kiln_add_model: unknown arguments: ${ARG_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT ARG_MODEL AND NOT ARG_KIR)
    message(FATAL_ERROR "kiln_add_model(${target}): give MODEL <name> or KIR <file>")
  endif()
  if(NOT ARG_CONFIG)
    set(ARG_CONFIG base)
  endif()
  if(NOT ARG_TARGET)
    set(ARG_TARGET host)
  endif()
  if(NOT ARG_WEIGHTS)
    set(ARG_WEIGHTS f32)
  endif()
  if(NOT ARG_NAME)
    set(ARG_NAME ${target})
  endif()
  set(out ${CMAKE_CURRENT_BINARY_DIR}/${target}.kiln)
  set(lib ${out}/lib${ARG_NAME}.a)
  set(header ${out}/${ARG_NAME}.h)
  if(ARG_KIR)
    get_filename_component(kir ${ARG_KIR} ABSOLUTE)
    set(emit_command)
    set(depends ${kir})
  else()
    set(kir ${out}/${ARG_NAME}.input.kir)
    set(sets)
    foreach(s ${ARG_SET})
      list(APPEND sets --set ${s})
    endforeach()
    set(emit_command COMMAND kiln::kiln emit ${ARG_MODEL} --config ${ARG_CONFIG} ${sets} -o ${kir})
    set(depends)
  endif()
  add_custom_command(
    OUTPUT ${lib} ${header}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${out}
    ${emit_command}
    COMMAND kiln::kiln compile ${kir} --target ${ARG_TARGET} --weights ${ARG_WEIGHTS} --name ${ARG_NAME} -o ${out}
    DEPENDS kiln::kiln ${depends}
    COMMENT "kiln: compiling model ${target}"
    VERBATIM)
  add_custom_target(${target}_kiln_compile DEPENDS ${lib} ${header})
  add_library(${target} INTERFACE)
  add_dependencies(${target} ${target}_kiln_compile)
  find_package(Threads REQUIRED)
  target_include_directories(${target} INTERFACE ${out})
  target_link_libraries(${target} INTERFACE ${lib} kiln::runtime Threads::Threads ${CMAKE_DL_LIBS})
endfunction()
