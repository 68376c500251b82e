# Compiles SOURCE (mismatch.cpp, collate_mismatch.cpp) twice: the control (types match)
# must compile, the real one must fail with an error naming both `apples` and `oranges`
# through pipe_type_mismatch.
set(flags -std=c++20 -fsyntax-only)
foreach(dir ${INCLUDES})
  list(APPEND flags -I${dir})
endforeach()
execute_process(COMMAND ${CXX} ${flags} -DSLUICE_CONTROL ${SOURCE}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "control case did not compile:\n${err}")
endif()
execute_process(COMMAND ${CXX} ${flags} ${SOURCE}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "a mismatched pipeline compiled")
endif()
if(NOT err MATCHES "pipe_type_mismatch<apples, *oranges>")
  message(FATAL_ERROR "the error does not name both types as pipe_type_mismatch<apples, oranges>:\n${err}")
endif()
message(STATUS "mismatch rejected; the compiler says pipe_type_mismatch<apples, oranges>")
