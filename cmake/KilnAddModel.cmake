# kiln_add_model(<target> (MODEL <model> | SOURCES <file.cpp>... | KIR <file.kir>)
#                [CONFIG <config>] [SET key=value...] [TARGET <halide-target>]
#                [WEIGHTS f32|bf16|int8] [BF16_PRODUCTS auto|dot|fma] [BF16_ACTIVATIONS on|off]
#                [NAME <library-name>] [JOBS <n>] [ENV var=value...])
#
# Gets a model's IR, compiles it with `kiln compile`, and defines <target>: a library to
# link that brings the generated header (<name>.h), the static library and kiln's runtime.
# In the spirit of Halide's add_halide_generator + add_halide_library. The IR comes from
#   MODEL    a model registered in kiln (`kiln models`), emitted by `kiln emit`;
#   SOURCES  your own model source(s) (frontend/generator.h: KILN_MODEL), built into a
#            generator program <target>_generator (linked with kiln::generator_main) that
#            writes the IR;
#   KIR      an IR file.
# CONFIG and SET pick the config and override its keys (MODEL and SOURCES; the default
# config is the model's only config, or base). JOBS is how many kernels `kiln compile`
# compiles at once (`-j`); without it, the variable KILN_MODEL_JOBS where set, else one
# per CPU. A build that runs several compiles at once (ninja -j2 over several models) sets
# a small value so that they do not oversubscribe the machine. The .kir that is compiled is
# the target's property KILN_KIR (e.g. for `kiln run` with the interpreter); the target
# <target>_kir writes it without compiling. ENV sets variables in `kiln compile`'s environment
# (bench/CMakeLists.txt: KILN_GPU_LINEAR, the GPU GEMM schedule experiments).
#
#   kiln_add_model(translator MODEL transformer CONFIG base SET max_len=256)
#   kiln_add_model(gpt SOURCES gpt.cpp CONFIG small SET max_len=256)
#   target_link_libraries(app PRIVATE translator gpt)   # then: #include "gpt.h"
function(kiln_add_model target)
  cmake_parse_arguments(ARG "" "MODEL;CONFIG;KIR;TARGET;NAME;WEIGHTS;BF16_PRODUCTS;BF16_ACTIVATIONS;JOBS" "SET;SOURCES;ENV"
                        ${ARGN})
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "kiln_add_model: unknown arguments: ${ARG_UNPARSED_ARGUMENTS}")
  endif()
  set(forms 0)
  foreach(form MODEL SOURCES KIR)
    if(ARG_${form})
      math(EXPR forms "${forms} + 1")
    endif()
  endforeach()
  if(NOT forms EQUAL 1)
    message(FATAL_ERROR "kiln_add_model(${target}): give one of MODEL <name>, SOURCES <files> "
                        "or KIR <file>")
  endif()
  if(ARG_KIR AND (ARG_CONFIG OR ARG_SET))
    message(FATAL_ERROR "kiln_add_model(${target}): CONFIG and SET need MODEL or SOURCES")
  endif()
  if(NOT ARG_TARGET)
    set(ARG_TARGET host)
  endif()
  if(NOT ARG_WEIGHTS)
    set(ARG_WEIGHTS f32)
  endif()
  if(NOT ARG_BF16_PRODUCTS)
    set(ARG_BF16_PRODUCTS auto)
  endif()
  if(NOT DEFINED ARG_BF16_ACTIVATIONS)  # (not `if(NOT ...)`: "off" is false to CMake)
    set(ARG_BF16_ACTIVATIONS on)
  elseif(NOT ARG_BF16_ACTIVATIONS MATCHES "^(on|off)$")
    message(FATAL_ERROR "kiln_add_model(${target}): BF16_ACTIVATIONS is "
                        "'${ARG_BF16_ACTIVATIONS}'; use on or off")
  endif()
  if(NOT ARG_NAME)
    set(ARG_NAME ${target})
  endif()
  if(NOT ARG_JOBS AND KILN_MODEL_JOBS)
    set(ARG_JOBS ${KILN_MODEL_JOBS})
  endif()
  set(jobs_option)
  if(ARG_JOBS)
    if(NOT ARG_JOBS MATCHES "^[1-9][0-9]*$")
      message(FATAL_ERROR "kiln_add_model(${target}): JOBS must be a whole number >= 1, got "
                          "'${ARG_JOBS}'")
    endif()
    set(jobs_option -j ${ARG_JOBS})
  endif()
  set(out ${CMAKE_CURRENT_BINARY_DIR}/${target}.kiln)
  set(lib ${out}/lib${ARG_NAME}.a)
  set(header ${out}/${ARG_NAME}.h)
  set(options)
  if(ARG_CONFIG)
    list(APPEND options --config ${ARG_CONFIG})
  endif()
  foreach(s ${ARG_SET})
    list(APPEND options --set ${s})
  endforeach()
  set(emit_command)
  set(depends)
  if(ARG_KIR)
    get_filename_component(kir ${ARG_KIR} ABSOLUTE)
    set(depends)
  else()
    set(kir ${out}/${ARG_NAME}.input.kir)
    if(ARG_MODEL)
      set(emit_command COMMAND kiln::kiln emit ${ARG_MODEL} ${options} -o ${kir})
      set(depends kiln::kiln)
    else()
      if(NOT TARGET kiln::dsl OR NOT TARGET kiln::generator_main)
        message(FATAL_ERROR "kiln_add_model(${target} SOURCES ...): kiln's DSL is not available "
                            "(the installed package loads it when fmt is found; Debian: libfmt-dev)")
      endif()
      add_executable(${target}_generator ${ARG_SOURCES})
      target_link_libraries(${target}_generator PRIVATE kiln::dsl kiln::generator_main)
      set(emit_command COMMAND ${target}_generator ${options} -o ${kir})
      set(depends ${target}_generator)
    endif()
  endif()
  if(emit_command)
    add_custom_command(
      OUTPUT ${kir}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${out}
      ${emit_command}
      DEPENDS ${depends}
      COMMENT "kiln: writing the IR of model ${target}"
      VERBATIM)
  endif()
  add_custom_target(${target}_kir DEPENDS ${kir})
  set(kiln_command kiln::kiln)
  if(ARG_ENV)
    set(kiln_command ${CMAKE_COMMAND} -E env ${ARG_ENV} $<TARGET_FILE:kiln::kiln>)
  endif()
  add_custom_command(
    OUTPUT ${lib} ${header}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${out}
    COMMAND ${kiln_command} compile ${kir} --target ${ARG_TARGET} --weights ${ARG_WEIGHTS}
            --bf16-products ${ARG_BF16_PRODUCTS} --bf16-activations ${ARG_BF16_ACTIVATIONS}
            --name ${ARG_NAME} ${jobs_option} -o ${out}
    DEPENDS kiln::kiln ${kir}
    COMMENT "kiln: compiling model ${target}"
    VERBATIM)
  add_custom_target(${target}_kiln_compile DEPENDS ${lib} ${header})
  add_library(${target} INTERFACE)
  add_dependencies(${target} ${target}_kiln_compile)
  set_target_properties(${target} PROPERTIES KILN_KIR ${kir})
  find_package(Threads REQUIRED)
  target_include_directories(${target} INTERFACE ${out})
  target_link_libraries(${target} INTERFACE ${lib} kiln::runtime Threads::Threads ${CMAKE_DL_LIBS})
endfunction()
