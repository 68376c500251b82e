# Installs sluice from SLUICE_BUILD_DIR into a private prefix, then configures, builds and
# runs tests/package/consumer against it (find_package) and against the source tree
# (add_subdirectory).
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()
run(${CMAKE_COMMAND} --install ${SLUICE_BUILD_DIR} --prefix ${prefix})
foreach(mode find_package subdirectory)
  set(bin ${WORK_DIR}/${mode})
  run(${CMAKE_COMMAND} -S ${SLUICE_SOURCE_DIR}/tests/package/consumer -B ${bin} -G ${GENERATOR}
      -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release -DSLUICE_MODE=${mode}
      -DSLUICE_SOURCE_DIR=${SLUICE_SOURCE_DIR} -DCMAKE_PREFIX_PATH=${prefix})
  run(${CMAKE_COMMAND} --build ${bin})
  run(${bin}/consumer)
  if(NOT last_output MATCHES "sum 30")
    message(FATAL_ERROR "${mode} consumer printed: ${last_output}")
  endif()
  message(STATUS "${mode} consumer: ${last_output}")
endforeach()
